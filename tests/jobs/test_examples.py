"""The example jobs carry the guards the README promises, and the simulated vendor behaves.

What the guards *do* to these jobs on real workers is checked end to end by
tests/jobs/test_platform_up.py (`jobs up` + `jobs demo`); these checks need no worker.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from jobs.embedded import free_port


def _guards(app: Any, name: str) -> dict[str, dict[str, Any]]:
    from jobs.pipeline_view import describe_pipelines

    view = describe_pipelines(app.tasks[f"jobs.examples.{name}"])
    return {row["guard"]: row["options"] for phase in view.values() for row in phase}


@pytest.fixture()
def vendor(app: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A simulated vendor on a free port, which the example charge calls."""
    from jobs.vendor import start_in_thread

    port = free_port()
    server = start_in_thread(port)
    monkeypatch.setattr(app, "settings", app.settings.model_copy(update={"vendor_port": port}))
    yield server
    server.shutdown()
    server.server_close()


def _post(url: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(url, method="POST", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


class TestExampleGuards:
    def test_charge_payment_is_the_payment_stack(self, app: Any) -> None:
        """Transactional idempotency on the order id, the vendor's breaker and rate limit,
        budgeted retries."""
        guards = _guards(app, "charge_payment")
        assert guards["idempotency"]["key"] == "charge:{order_id}"
        assert guards["idempotency"]["transactional"] is True
        assert guards["breaker"]["name"] == "payments-vendor"
        assert guards["rate-limit"]["name"] == "payments-vendor"
        assert guards["retry"]["dependency"] == "payments-vendor"
        assert guards["retry"]["budget"]["ratio"] == 0.2

    def test_report_settlement_and_warm_up_guards(self, app: Any) -> None:
        """A singleton report per day, an exclusive fenced settlement, a unique warm-up with
        a deadline."""
        assert _guards(app, "build_daily_report")["singleton"]["key"] == "report:{day}"
        settle = _guards(app, "settle_account")["exclusive"]
        assert settle["key"] == "settlement:{account}" and settle["fencing"] is True
        warm = _guards(app, "warm_cache")
        assert "unique" in warm
        assert warm["deadline"]["deadline_seconds"] == 2.0


class TestVendor:
    def test_charge_reaches_the_vendor_once_per_order(self, vendor: Any) -> None:
        """The order id is the vendor's idempotency key: a repeat returns the first charge."""
        from jobs.examples import charge_at_vendor

        first = charge_at_vendor("o-ex-1", "acct-1", 1200, "EUR")
        again = charge_at_vendor("o-ex-1", "acct-1", 1200, "EUR")
        assert again["charge_id"] == first["charge_id"] and again["replayed"] is True
        assert vendor.state.describe()["calls"] == 2
        assert vendor.state.describe()["charges"] == 1

    def test_vendor_failures_are_classified(self, app: Any, vendor: Any) -> None:
        """503 is Retryable with the vendor's Retry-After, a refused charge NonRetryable,
        an unreachable vendor Retryable."""
        from jobs.examples import charge_at_vendor
        from jobs.vendor import VendorControl
        from resilience.retry import NonRetryable, Retryable

        control = VendorControl(app.settings.effective_vendor_url)
        assert control.set_mode("fail")["mode"] == "fail"
        with pytest.raises(Retryable, match="HTTP 503") as failed:
            charge_at_vendor("o-ex-2", "acct-1", 1200, "EUR")
        assert failed.value.retry_after_seconds == 1.0 and failed.value.status == 503
        control.set_mode("ok")
        with pytest.raises(NonRetryable, match="HTTP 422"):
            charge_at_vendor("o-ex-3", "acct-1", 0, "EUR")
        vendor.shutdown()
        vendor.server_close()
        with pytest.raises(Retryable, match="unreachable"):
            charge_at_vendor("o-ex-4", "acct-1", 1200, "EUR")

    def test_slow_mode_delays_and_bad_control_input_is_refused(self, vendor: Any) -> None:
        """`slow` answers after its delay; an unknown mode is a one-line error."""
        from jobs.vendor import VendorControl, VendorError

        url = f"http://127.0.0.1:{vendor.server_address[1]}"
        control = VendorControl(url)
        assert control.set_mode("slow", delay_seconds=0.3)["delay_seconds"] == 0.3
        started = time.monotonic()
        status = _post(f"{url}/charges", {"amount_cents": 5}, {"Idempotency-Key": "k"})[0]
        assert status == 201 and time.monotonic() - started >= 0.3
        with pytest.raises(VendorError, match="unknown vendor mode"):
            control.set_mode("down")
        request = urllib.request.Request(f"{url}/control", method="PUT", data=b'{"mode": "x"}')
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=5)
        assert refused.value.code == 400

    def test_control_refuses_clients_beyond_loopback(self) -> None:
        """The mode can be changed only from this machine (no CSRF token needed)."""
        from jobs.settings import is_loopback as _is_loopback

        assert _is_loopback("127.0.0.1") and _is_loopback("::1")
        assert not _is_loopback("10.0.0.7") and not _is_loopback("not-an-ip")
