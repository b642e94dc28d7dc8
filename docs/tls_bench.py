"""What TLS costs: produce 1 KiB records over a node's PLAINTEXT and SSL
listeners, then consume all of them over each, with a SHA-256 of the values
read (equal: TLS delivered the same bytes).

    python docs/tls_bench.py PLAINTEXT_HOST:PORT SSL_HOST:PORT CA.pem RECORDS

The node is one from docs/security.md ("A secured node, step by step").
"""
import hashlib, sys, time
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
plain, tls, ca, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
topic = f"bench-{int(time.time())}"
a = AdminClient({"bootstrap.servers": plain}); a.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
def produce(conf, label):
    p = Producer({**conf, "linger.ms": 20, "batch.size": 1000000, "acks": 1})
    t = time.monotonic()
    for i in range(n):
        while True:
            try: p.produce(topic, value=i.to_bytes(8, "big") * 128); break
            except BufferError: p.poll(0.01)
    assert p.flush(120) == 0
    dt = time.monotonic() - t
    print(f"produce {label}: {n} x 1 KiB in {dt:.2f} s = {n * 1024 / dt / 1e6:.1f} MB/s")
def consume(conf, label):
    c = Consumer({**conf, "group.id": label, "enable.auto.commit": False, "fetch.max.bytes": 52428800})
    c.assign([TopicPartition(topic, 0, 0)])
    h = hashlib.sha256(); got = 0; t = time.monotonic()
    while got < 2 * n:
        for m in c.consume(1000, 1.0):
            assert m.error() is None, m.error()
            h.update(m.value()); got += 1
        assert time.monotonic() - t < 300
    dt = time.monotonic() - t
    print(f"consume {label}: {got} x 1 KiB in {dt:.2f} s = {got * 1024 / dt / 1e6:.1f} MB/s sha256={h.hexdigest()[:16]}")
    c.close()
tlsconf = {"bootstrap.servers": tls, "security.protocol": "SSL", "ssl.ca.location": ca}
produce({"bootstrap.servers": plain}, "PLAINTEXT")
produce(tlsconf, "SSL")
consume({"bootstrap.servers": plain}, "PLAINTEXT")
consume(tlsconf, "SSL")
