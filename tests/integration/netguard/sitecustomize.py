"""Loaded by a child interpreter (via PYTHONPATH) to make every non-loopback connection fail fast.

Each refused attempt (a DNS lookup of a non-local name, or a connect to a non-loopback address)
is appended to the file named by NETGUARD_LOG, so a test can assert there were none.
"""

import ipaddress
import os
import socket

_LOG = os.environ.get("NETGUARD_LOG", "")
_LOCAL_NAMES = {"localhost", "ip6-localhost", "ip6-loopback"}


def _record(what: str) -> None:
    if _LOG:
        with open(_LOG, "a", encoding="utf-8") as log:
            log.write(what + "\n")


def _is_loopback(host: object) -> bool:
    if not isinstance(host, str):
        return False
    if host in _LOCAL_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


_real_getaddrinfo = socket.getaddrinfo
_real_connect = socket.socket.connect
_real_connect_ex = socket.socket.connect_ex


def _guarded_getaddrinfo(host, *args, **kwargs):  # type: ignore[no-untyped-def]
    if host is not None and not _is_loopback(host if isinstance(host, str) else host.decode()):
        _record(f"getaddrinfo {host}")
        raise socket.gaierror(socket.EAI_NONAME, "network disabled by netguard")
    return _real_getaddrinfo(host, *args, **kwargs)


def _check_address(sock: socket.socket, address: object) -> None:
    inet = sock.family in (socket.AF_INET, socket.AF_INET6) and isinstance(address, tuple)
    if inet and not _is_loopback(address[0]):  # type: ignore[index]
        _record(f"connect {address[0]}")  # type: ignore[index]
        raise OSError(101, "network disabled by netguard")


def _guarded_connect(self, address):  # type: ignore[no-untyped-def]
    _check_address(self, address)
    return _real_connect(self, address)


def _guarded_connect_ex(self, address):  # type: ignore[no-untyped-def]
    _check_address(self, address)
    return _real_connect_ex(self, address)


socket.getaddrinfo = _guarded_getaddrinfo
socket.socket.connect = _guarded_connect  # type: ignore[method-assign]
socket.socket.connect_ex = _guarded_connect_ex  # type: ignore[method-assign]
