"""Listening sockets for the engine's servers: TCP, with Nagle's algorithm off on every connection.

``socket.create_server`` makes a socket whose protocol number is 0; asyncio sets ``TCP_NODELAY``
on an accepted connection only when the listener says ``IPPROTO_TCP`` (``base_events._set_nodelay``
checks ``sock.proto``), and uvicorn sets it only on the sockets it creates itself. With Nagle on,
each small answer waits for the client's delayed ACK: 40–44 ms per keep-alive request instead of
well under one (issue 27). So the listener is created with the TCP protocol number, which makes
asyncio set the option on each accepted transport, and carries ``TCP_NODELAY`` itself, which
Linux copies to every connection it accepts (a second line for servers that are not asyncio).
"""

from __future__ import annotations

import socket

BACKLOG = 2048  # uvicorn's default: bursts of agent calls are not refused at accept


def set_nodelay(sock: socket.socket) -> None:
    """Turn Nagle's algorithm off on a TCP socket (a no-op for Unix sockets)."""
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def tcp_listener(host: str, port: int, backlog: int = BACKLOG) -> socket.socket:
    """Bind and listen on ``host:port`` (0 picks a free port) like ``socket.create_server``,
    with ``TCP_NODELAY`` on every accepted connection.

    :raises OSError: the address cannot be resolved or bound (in use, not ours)
    """
    family, kind, proto, _, address = socket.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP,
        flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto or socket.IPPROTO_TCP)
    try:
        # a restarted server binds again at once though old connections sit in TIME_WAIT
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        set_nodelay(sock)
        sock.bind(address)
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    return sock
