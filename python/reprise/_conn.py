"""Connection options and the request-reply machinery shared by the clients."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import re
import ssl
from collections.abc import Callable, Coroutine
from typing import Any

import nats
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from . import errors

DEFAULT_URL = "nats://127.0.0.1:4222"
DEFAULT_PREFIX = "reprise"

HEADER_PART = "Reprise-Part"
HEADER_PARTS = "Reprise-Parts"


class NoServiceError(errors.UnavailableError):
    """NATS's answer to a request nobody listens for: no table service runs
    for the prefix (the public type is UnavailableError)."""


@dataclasses.dataclass(frozen=True)
class ConnectOptions:
    """How to reach a deployment: the same settings as the Go side's
    ``--nats``, ``--creds``, ``--tls-ca``, ``--tls-cert``, ``--tls-key`` and
    ``--prefix`` flags, plus user/password and an nkey seed."""

    servers: str | tuple[str, ...] = DEFAULT_URL
    prefix: str = DEFAULT_PREFIX
    user: str | None = None
    password: str | None = None
    token: str | None = None
    nkeys_seed: str | None = None
    credentials: str | None = None
    tls: ssl.SSLContext | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_hostname: str | None = None
    inbox_prefix: str | None = None
    name: str | None = None
    connect_timeout: float = 10.0
    reconnect_time_wait: float = 0.25

    def __post_init__(self) -> None:
        check_prefix(self.prefix)
        if (self.tls_cert is None) != (self.tls_key is None):
            raise errors.InvalidArgumentError("tls_cert and tls_key go together")
        if self.inbox_prefix is not None and (
            not self.inbox_prefix
            or self.inbox_prefix[0] == "."
            or self.inbox_prefix[-1] == "."
            or any(ch in self.inbox_prefix for ch in "*> \t")
        ):
            raise errors.InvalidArgumentError(f"invalid inbox prefix {self.inbox_prefix!r}")

    def reply_inbox(self) -> str | None:
        """Where replies arrive: the given inbox prefix, else the user's own
        inbox ``_INBOX.<user>`` (the only one a Reprise role may read, see
        the README's roles), else NATS's default."""
        if self.inbox_prefix is not None:
            return self.inbox_prefix
        if self.user is not None:
            return "_INBOX." + self.user
        return None

    def ssl_context(self) -> ssl.SSLContext | None:
        if self.tls is not None:
            return self.tls
        if self.tls_ca is None and self.tls_cert is None:
            return None
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.tls_ca)
        if self.tls_cert is not None and self.tls_key is not None:
            ctx.load_cert_chain(self.tls_cert, self.tls_key)
        return ctx

    def nats_kwargs(self) -> dict[str, Any]:
        servers = [self.servers] if isinstance(self.servers, str) else list(self.servers)
        servers = [s for part in servers for s in part.split(",") if s]
        kw: dict[str, Any] = dict(
            servers=servers,
            name=self.name or "reprise-python",
            allow_reconnect=True,
            max_reconnect_attempts=-1,
            reconnect_time_wait=self.reconnect_time_wait,
            connect_timeout=max(1, int(self.connect_timeout)),
        )
        if self.user is not None:
            kw["user"] = self.user
        if self.password is not None:
            kw["password"] = self.password
        if self.token is not None:
            kw["token"] = self.token
        if self.nkeys_seed is not None:
            kw["nkeys_seed"] = self.nkeys_seed
        if self.credentials is not None:
            kw["user_credentials"] = self.credentials
        inbox = self.reply_inbox()
        if inbox is not None:
            kw["inbox_prefix"] = inbox
        ctx = self.ssl_context()
        if ctx is not None:
            kw["tls"] = ctx
            if self.tls_hostname is not None:
                kw["tls_hostname"] = self.tls_hostname
        return kw


def check_prefix(prefix: str) -> None:
    """Rejects prefixes that are not dot-separated tokens without spaces or
    wildcards (as broker.newSubjects does)."""
    for tok in prefix.split("."):
        if not tok or any(ch in tok for ch in " \t\r\n*>"):
            raise errors.InvalidArgumentError(
                f"invalid subject prefix {prefix!r} (dot-separated tokens without spaces or wildcards)"
            )


class Subjects:
    """Every subject of a deployment, from its prefix (broker/subjects.go)."""

    def __init__(self, prefix: str) -> None:
        check_prefix(prefix)
        self.prefix = prefix
        self.insert = prefix + ".data.insert"
        self.mutate = prefix + ".data.mutate"
        self.applied = prefix + ".applied"
        self.sample = prefix + ".api.sample"
        self.info = prefix + ".api.info"
        self.items = prefix + ".api.items"
        self.reset = prefix + ".api.reset"
        self.checkpoint = prefix + ".api.checkpoint"


async def open_connection(opts: ConnectOptions, **callbacks: Any) -> NATS:
    """Connects, retrying until opts.connect_timeout passes (a deployment
    that is still starting is waited for)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + opts.connect_timeout
    kw = opts.nats_kwargs()
    last: BaseException | None = None
    delay = 0.05
    while True:
        left = deadline - loop.time()
        try:
            return await _connect_once(kw, callbacks, max(0.5, left))
        except Exception as e:  # noqa: BLE001 - every failure to connect is retried
            last = e
        if loop.time() + delay > deadline:
            raise errors.UnavailableError(
                f"cannot connect to NATS at {', '.join(kw['servers'])} within {opts.connect_timeout}s "
                f"(is reprised running?): {last}"
            ) from last
        await asyncio.sleep(delay)
        delay = min(delay * 2, 1.0)


async def _connect_once(kw: dict[str, Any], cbs: dict[str, Any], timeout: float) -> NATS:
    async def quiet(_e: Exception) -> None:
        pass  # failures to connect are reported by open_connection

    cbs = {"error_cb": quiet, **cbs}
    nc = NATS()
    # An initial connect tries each server once; reconnects after it are
    # unlimited (max_reconnect_attempts applies to those).
    await asyncio.wait_for(nc.connect(**kw, **cbs), timeout)
    return nc


# Older servers capitalise it ("Permissions Violation for Publish to").
_PERMISSION_VIOLATION = re.compile(r'permissions violation for (publish|subscription) to "([^"]+)"', re.IGNORECASE)


def permission_denied(err: BaseException, user: str | None) -> errors.PermissionDeniedError | None:
    """The PermissionDeniedError a NATS error reports, or None when it is
    not a permissions violation."""
    m = _PERMISSION_VIOLATION.search(str(err))
    if m is None:
        return None
    op = "publish" if m.group(1).lower() == "publish" else "subscribe"
    who = f"user {user!r}" if user else "this connection's user"
    return errors.PermissionDeniedError(
        f"the NATS server refused {who} to {op} {m.group(2)!r}: its role does not allow it "
        "(reprisectl permissions prints what each role may do)",
        operation=op,
        subject=m.group(2),
    )


class Denials:
    """Hands the server's permission violations on one connection to the
    parts that made the refused publish or subscription, so their calls
    fail at once rather than waiting for answers that cannot come."""

    def __init__(self) -> None:
        self._listeners: set[Callable[[errors.PermissionDeniedError], None]] = set()
        # Notice inboxes of the connection's writers, by subject: what a
        # message nats-py dropped on one (a slow consumer) is told.
        self._drops: dict[str, Callable[[], None]] = {}

    def watch_drops(self, subject: str, cb: Callable[[], None]) -> None:
        self._drops[subject] = cb

    def unwatch_drops(self, subject: str) -> None:
        self._drops.pop(subject, None)

    def dropped(self, subject: str) -> bool:
        """Tells the watcher of subject that nats-py dropped a message on
        it; False when no one watches subject."""
        cb = self._drops.get(subject)
        if cb is None:
            return False
        cb()
        return True

    def add(self, cb: Callable[[errors.PermissionDeniedError], None]) -> None:
        self._listeners.add(cb)

    def discard(self, cb: Callable[[errors.PermissionDeniedError], None]) -> None:
        self._listeners.discard(cb)

    def dispatch(self, err: errors.PermissionDeniedError) -> None:
        for cb in list(self._listeners):
            cb(err)


class _Call:
    __slots__ = ("future", "parts", "want", "subject", "withdrawal", "lost")

    def __init__(
        self, future: asyncio.Future[list[bytes]], subject: str, withdrawal: Callable[[str], bytes] | None = None
    ) -> None:
        self.future = future
        self.parts: list[bytes] = []
        self.want = 0
        self.subject = subject
        # What withdraws the request, given its reply subject (a sample
        # request's), or None.
        self.withdrawal = withdrawal
        # Failed by a lost connection: the request may still wait at the
        # service, which has a connection of its own.
        self.lost = False


class Requester:
    """Request-reply over one wildcard inbox subscription, so that replies in
    several parts (headers Reprise-Part / Reprise-Parts) find their call.
    Runs on the connection's event loop."""

    def __init__(self, nc: NATS, prefix: str) -> None:
        self._nc = nc
        self._prefix = prefix
        self._inbox = nc.new_inbox()
        self._pending: dict[str, _Call] = {}
        self._ids = itertools.count(1)
        self._sub: Any = None
        self._denied: errors.PermissionDeniedError | None = None

    async def start(self) -> None:
        self._sub = await self._nc.subscribe(self._inbox + ".*", cb=self._on_reply, pending_bytes_limit=1 << 30)

    async def stop(self) -> None:
        # The calls a closing client ends are withdrawn before the
        # connection drains: nobody will read their replies. So are those
        # cancelled whose callers have not run since (a sampler's aclose
        # right before): their futures are done, and their callers, which
        # would withdraw them, find them gone once they run.
        calls, self._pending = self._pending, {}
        for token, call in calls.items():
            if call.withdrawal is not None and (not call.future.done() or call.future.cancelled()):
                await self._withdraw(call, token)
        if self._sub is not None:
            try:
                await self._sub.unsubscribe()
            except Exception:  # noqa: BLE001 - the connection may be gone
                pass
        self._pending.update(calls)
        self.fail_all(errors.ClosedError("client closed"))

    def fail_all(self, err: errors.RepriseError, *, lost: bool = False) -> None:
        """Fails every call waiting for a reply (the connection was lost:
        their replies will not come). With ``lost`` (the connection is
        being restored), the calls that can be withdrawn are, by their
        callers: the publish waits in the connection's buffer until it
        reconnects."""
        calls, self._pending = self._pending, {}
        for c in calls.values():
            if not c.future.done():
                c.lost = lost
                c.future.set_exception(err)

    def on_denied(self, err: errors.PermissionDeniedError) -> None:
        """Fails the calls a refused publish or subscription leaves without
        an answer: those sent to the subject, or every call when the reply
        inbox itself was refused (and every later call too)."""
        if err.operation == "subscribe":
            if err.subject == self._inbox + ".*":
                self._denied = err
                self.fail_all(err)
            return
        for token, call in list(self._pending.items()):
            if call.subject == err.subject and not call.future.done():
                del self._pending[token]
                call.future.set_exception(err)

    async def _on_reply(self, m: Msg) -> None:
        token = m.subject[m.subject.rfind(".") + 1 :]
        call = self._pending.get(token)
        if call is None or call.future.done():
            return  # the caller gave up
        hdr = m.headers
        if hdr is not None and not m.data and hdr.get("Status") == "503":
            del self._pending[token]
            call.future.set_exception(
                NoServiceError(
                    f"no table service is listening on {call.subject} (is reprised running with prefix {self._prefix!r}?)"
                )
            )
            return
        parts = hdr.get(HEADER_PARTS) if hdr else None
        if parts is None:
            del self._pending[token]
            call.future.set_result([m.data])
            return
        try:
            n, i = int(parts), int(hdr.get(HEADER_PART, "")) if hdr else -1
        except ValueError:
            n, i = 0, -1
        if n < 1 or i != len(call.parts) or (call.want and call.want != n):
            del self._pending[token]
            call.future.set_exception(errors.ProtocolError(f"reply part {i} of {parts} out of order"))
            return
        call.want = n
        call.parts.append(m.data)
        if len(call.parts) == n:
            del self._pending[token]
            call.future.set_result(call.parts)

    async def _withdraw(self, call: _Call, token: str) -> None:
        """Publishes the withdrawal of the request token, best effort: one
        that is lost leaves the request as it was."""
        assert call.withdrawal is not None
        try:
            await self._nc.publish(call.subject, call.withdrawal(self._inbox + "." + token))
        except Exception:  # noqa: BLE001 - the connection may be gone, and the request with it
            pass

    async def request(
        self,
        subject: str,
        data: bytes,
        timeout: float | None,
        *,
        watch: Callable[[], Coroutine[Any, Any, None]] | None = None,
        watch_after: float = 0.0,
        withdrawal: Callable[[str], bytes] | None = None,
    ) -> bytes:
        """Sends data and returns the whole reply, joined from its parts.
        Raises DeadlineExceededError when timeout (seconds) passes first,
        without sending when it is not above 0.
        Once watch_after seconds pass without the reply, watch() starts and
        runs until the reply comes; what it raises fails the call (a check
        that the service still listens). The call's deadline and watch are
        timers of the loop, not tasks: a request that is answered in time,
        as nearly all are, costs the loop no more than its reply.
        With ``withdrawal`` (what withdraws the request, given its reply
        subject), a call that ends without its reply (cancelled, timed
        out, failed by watch or by a lost connection, or by :meth:`stop`)
        publishes it, so that the service takes nothing more for a caller
        that stopped waiting."""
        if self._denied is not None:
            raise self._denied
        # The service acts on a request whatever becomes of its caller: a
        # sample takes its items, a reset empties the table. One whose
        # caller has no time left for the reply is not sent (as in Go).
        if timeout is not None and timeout <= 0:
            raise errors._NotSentError(f"not sending to {subject}: no time left for the reply")
        loop = asyncio.get_running_loop()
        token = format(next(self._ids), "x")
        fut: asyncio.Future[list[bytes]] = loop.create_future()
        call = self._pending[token] = _Call(fut, subject, withdrawal)
        sent = False
        timers: list[asyncio.TimerHandle] = []
        watcher: list[asyncio.Task[None]] = []

        def expire() -> None:
            if not fut.done():
                fut.set_exception(
                    errors.DeadlineExceededError(f"no reply from the table service on {subject} within {timeout:.3g}s")
                )

        def fail(task: asyncio.Task[None]) -> None:
            err = None if task.cancelled() else task.exception()
            if err is not None and not fut.done():
                fut.set_exception(err)

        def start_watch() -> None:
            assert watch is not None
            task = loop.create_task(watch())
            task.add_done_callback(fail)
            watcher.append(task)

        try:
            await self._nc.publish(subject, data, reply=self._inbox + "." + token)
            sent = True
            if timeout is not None:
                timers.append(loop.call_later(max(0.0, timeout), expire))
            if watch is not None:
                timers.append(loop.call_later(watch_after, start_watch))
            parts = await fut
        except nats.errors.ConnectionClosedError:
            raise errors.ClosedError("connection closed") from None
        except nats.errors.OutboundBufferLimitError:
            raise errors.UnavailableError(f"not connected to NATS; cannot send to {subject}") from None
        finally:
            # Still pending: no reply came, and nothing else (stop) ended
            # the call; or a lost connection ended it, while the service
            # may still hold the request.
            abandoned = (self._pending.pop(token, None) is not None or call.lost) and sent
            for t in timers:
                t.cancel()
            for task in watcher:
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            if abandoned and withdrawal is not None:
                await self._withdraw(call, token)
        return parts[0] if len(parts) == 1 else b"".join(parts)
