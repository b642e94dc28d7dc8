"""Errors of ZooKeeper mode, all under `common.errors.RaftkaError`."""

from common.errors import RaftkaError


class ZooKeeperModeError(RaftkaError):
    """Root of ZooKeeper-mode errors."""


class MalformedZNodeError(ZooKeeperModeError):
    """A znode holds data that is not Kafka's JSON for that path.

    Something other than Kafka or raftka wrote it, or it was corrupted;
    inspect it with `zkCli.sh get <path>` and repair or delete it.
    """


class ControllerMovedError(ZooKeeperModeError):
    """This controller lost its election: `/controller_epoch` moved past our
    epoch, so a newer controller exists. The controller resigns and campaigns
    again; nothing it decided after losing was written."""


class EnsembleError(ZooKeeperModeError):
    """The ZooKeeper ensemble could not be started or did not come up.

    The message includes the server's log tail. Check that Java and the
    Debian `zookeeper` package are installed (`make sysdeps`) and that the
    ports are free.
    """


class StaleZNodeVersionError(ZooKeeperModeError):
    """A conditional write lost a race: the znode's zkVersion is not the one
    the writer read. Re-read the znode and decide again (a leader changing its
    ISR waits for the controller's next LeaderAndIsr instead)."""
