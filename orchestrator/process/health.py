"""Is a running engine still answering? A thread that probes ``GET /health`` while a trial drives load.

SGLang's ``/health`` (and ``/health_generate``, the same handler) is not a static page: unless
``SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=0``, it submits a one-token generation and answers 200 as
soon as any output reaches the server's front after the probe started. So it answers quickly while
the engine produces tokens, even under heavy load, and fails when the engine has stopped producing:
SGLang itself gives up after ``SGLANG_HEALTH_CHECK_TIMEOUT`` (20 s by default) and returns 503.
SGLang's scheduler drops the probe's generation while it has running requests (their output answers
it), so probing during a load point does not perturb what the point measures; an idle engine runs
the one token. (``/ready`` would be cheaper still, but only newer SGLang versions have it.)

Two ways of failing, two patiences:

* **refused** (connection refused or reset: the port is closed, the server is gone): nothing else
  can explain it, so a few probes in a row (about 2 s at the default period) are enough;
* **unanswered** (a probe that timed out, or an error status such as SGLang's 503): a busy engine
  can be slow to answer, so only a streak lasting ``patience_s`` (30 s by default, longer than
  SGLang's own 20 s check) counts.

The thread only sets :attr:`HealthProber.verdict`; reading it costs nothing, so a load point may
ask it as often as it likes.
"""

from __future__ import annotations

import contextlib
import http.client
import threading
import time
from urllib.parse import urlsplit

PERIOD_S = 1.0  # between the end of one probe and the start of the next
PROBE_TIMEOUT_S = 5.0
REFUSED_STREAK = 3  # refused probes in a row: ~2 s at PERIOD_S
PATIENCE_S = 30.0  # how long probes may go unanswered before the engine counts as stopped


def probe_health(host: str, port: int, timeout_s: float) -> tuple[bool | None, str]:
    """One ``GET /health``: (True, "") when 200; (None, why) when refused; (False, why) otherwise."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout_s)  # no proxy: the engine is local
    try:
        conn.request("GET", "/health")
        resp = conn.getresponse()
        resp.read()
        return (True, "") if resp.status == 200 else (False, f"HTTP {resp.status}")
    except (ConnectionRefusedError, ConnectionResetError) as exc:  # incl. http.client.RemoteDisconnected
        return None, f"{type(exc).__name__}: {exc}"
    except TimeoutError:
        return False, f"no answer within {timeout_s:g} s"
    except (OSError, http.client.HTTPException) as exc:
        return False, f"{type(exc).__name__}: {exc}"
    finally:
        conn.close()


class HealthProber:
    """Probes ``url/health`` every ``period_s`` on a daemon thread from :meth:`start` to :meth:`stop`.

    :attr:`verdict` is None while the engine answers, else one line saying how it stopped
    answering ("connections refused for 2.0 s", "no answer for 31 s (last: HTTP 503)"); it goes back
    to None as soon as a probe succeeds."""

    def __init__(self, url: str, *, period_s: float = PERIOD_S, timeout_s: float = PROBE_TIMEOUT_S,
                 refused_streak: int = REFUSED_STREAK, patience_s: float = PATIENCE_S) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.period_s, self.timeout_s = period_s, timeout_s
        self.refused_streak, self.patience_s = refused_streak, patience_s
        self.verdict: str | None = None
        self._refused = 0  # refused probes in a row
        self._refused_since: float | None = None
        self._failing_since: float | None = None  # start of the current streak of failed probes
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine-health", daemon=True)

    def start(self) -> HealthProber:
        self._thread.start()
        return self

    def stop(self) -> None:
        """No more probes. A probe in flight is not waited for (up to ``timeout_s`` against a frozen
        engine, which the session is about to kill): the daemon thread ends with it."""
        self._stop.set()
        with contextlib.suppress(RuntimeError):  # never started
            self._thread.join(timeout=0.2)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            sent = time.monotonic()
            ok, why = probe_health(self.host, self.port, self.timeout_s)
            self._update(ok, why, sent, time.monotonic())

    def _update(self, ok: bool | None, why: str, sent: float, now: float) -> None:
        """One probe's outcome: ``sent`` when it left (a streak starts with the first probe that was
        not answered, not when its timeout ran out), ``now`` when it came back."""
        if ok:
            self._refused, self._refused_since, self._failing_since = 0, None, None
            self.verdict = None
            return
        if self._failing_since is None:
            self._failing_since = sent
        if ok is None:
            self._refused += 1
            if self._refused_since is None:
                self._refused_since = sent
        else:  # an answer of any kind, or a timeout: the port is open, the refused streak is over
            self._refused, self._refused_since = 0, None
        if self._refused >= self.refused_streak:
            assert self._refused_since is not None
            self.verdict = f"connections refused for {now - self._refused_since:.1f} s"
        elif now - self._failing_since >= self.patience_s:
            self.verdict = f"no answer for {now - self._failing_since:.0f} s (last: {why})"
