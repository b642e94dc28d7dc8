import functools

import pytest

from common.wire import serve


@pytest.fixture
def start_server(nursery):
    """`await start_server(handler, apis, **serve_kwargs)` -> Server on 127.0.0.1."""

    async def start(handler, apis, **kwargs):
        return await nursery.start(
            functools.partial(serve, handler, "127.0.0.1", 0, apis=apis, **kwargs)
        )

    return start
