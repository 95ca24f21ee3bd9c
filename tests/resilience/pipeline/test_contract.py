"""The pipeline's contract on its own: phase order, unwinding, the stage table.

These drive `Pipeline` and `EnqueuePipeline` with small recording guards (no stores): the
behaviour under test is the pipeline's ordering, which needs nothing else.
"""

from __future__ import annotations

from typing import Any

import pytest

from resilience.errors import ConfigurationError
from resilience.outcomes import Outcome, Stop
from resilience.pipeline import (
    Call,
    EnqueueGuard,
    EnqueuePipeline,
    EnqueueStage,
    Guard,
    Pipeline,
    Publish,
    Stage,
)


class Recorder(Guard):
    """Records every hook it sees into a shared list."""

    def __init__(self, name: str, stage: Stage, log: list[str], *, stop: bool = False,
                 fail_give_back: bool = False, fail_commit: bool = False) -> None:
        self.name = name  # type: ignore[misc]
        self.stage = stage  # type: ignore[misc]
        self.log = log
        self.stop = stop
        self.fail_give_back = fail_give_back
        self.fail_commit = fail_commit

    def before_run(self, call: Call) -> None:
        self.log.append(f"take {self.name}")
        if self.stop:
            raise Stop(Outcome.SKIPPED, guard=self.name, reason="no")

    def commit(self, call: Call, result: Any) -> None:
        self.log.append(f"commit {self.name}")
        if self.fail_commit:
            raise Stop(Outcome.DEFERRED, guard=self.name, reason="lost", retry_after_seconds=1)

    def _give(self, how: str) -> None:
        self.log.append(f"{how} {self.name}")
        if self.fail_give_back:
            raise RuntimeError(f"{self.name} could not give back")

    def after_run(self, call: Call, result: Any) -> None:
        self._give("give-back")

    def on_error(self, call: Call, exc: BaseException) -> None:
        self._give("error")

    def on_stop(self, call: Call, stop: Stop) -> None:
        self._give("stop")


def _call() -> Call:
    return Call(task=None, args=(), kwargs={}, request=None)  # type: ignore[arg-type]


class TestExecutionPhases:
    def test_every_commit_happens_before_any_give_back(self) -> None:
        """take outermost first, run, commit innermost first, then give back innermost first."""
        log: list[str] = []
        pipeline = Pipeline([
            Recorder("lock", Stage.EXCLUSIVITY, log),
            Recorder("idempotency", Stage.IDEMPOTENCY, log),
            Recorder("limit", Stage.RATE, log),
        ])
        assert pipeline.run(_call(), lambda: log.append("body") or "ok") == "ok"
        assert log == [
            "take idempotency", "take lock", "take limit", "body",
            "commit limit", "commit lock", "commit idempotency",
            "give-back limit", "give-back lock", "give-back idempotency",
        ]

    def test_a_stop_gives_back_only_what_was_taken(self) -> None:
        """A guard that stops unwinds the guards already entered, not itself nor later ones."""
        log: list[str] = []
        pipeline = Pipeline([
            Recorder("idempotency", Stage.IDEMPOTENCY, log),
            Recorder("lock", Stage.EXCLUSIVITY, log, stop=True),
            Recorder("limit", Stage.RATE, log),
        ])
        with pytest.raises(Stop):
            pipeline.run(_call(), lambda: log.append("body"))
        assert log == ["take idempotency", "take lock", "stop idempotency"]

    def test_a_failed_commit_gives_everything_back(self) -> None:
        """A commit that stops (a lease lost) is a stop for every guard entered."""
        log: list[str] = []
        pipeline = Pipeline([
            Recorder("idempotency", Stage.IDEMPOTENCY, log, fail_commit=True),
            Recorder("lock", Stage.EXCLUSIVITY, log),
        ])
        with pytest.raises(Stop):
            pipeline.run(_call(), lambda: "ok")
        assert log == ["take idempotency", "take lock", "commit lock", "commit idempotency",
                       "stop lock", "stop idempotency"]

    def test_one_failed_give_back_does_not_keep_the_others(self) -> None:
        log: list[str] = []
        pipeline = Pipeline([
            Recorder("idempotency", Stage.IDEMPOTENCY, log),
            Recorder("lock", Stage.EXCLUSIVITY, log, fail_give_back=True),
        ])
        with pytest.raises(RuntimeError, match="lock could not give back"):
            pipeline.run(_call(), lambda: "ok")
        assert log[-2:] == ["give-back lock", "give-back idempotency"]

    def test_body_error_skips_commit(self) -> None:
        log: list[str] = []
        pipeline = Pipeline([Recorder("idempotency", Stage.IDEMPOTENCY, log)])

        def body() -> None:
            raise ValueError("boom")

        with pytest.raises(ValueError):
            pipeline.run(_call(), body)
        assert log == ["take idempotency", "error idempotency"]


class TestStageTable:
    def test_two_guards_in_a_single_stage_are_refused(self) -> None:
        with pytest.raises(ConfigurationError, match="share the EXCLUSIVITY stage"):
            Pipeline([Recorder("singleton", Stage.EXCLUSIVITY, []),
                      Recorder("exclusive", Stage.EXCLUSIVITY, [])])

    def test_stages_that_hold_several_keep_declaration_order(self) -> None:
        log: list[str] = []
        pipeline = Pipeline([Recorder("payments", Stage.BREAKER, log),
                             Recorder("ledger", Stage.BREAKER, log)])
        pipeline.run(_call(), lambda: None)
        assert log[:2] == ["take payments", "take ledger"]

    def test_the_same_guard_twice_is_refused_even_where_several_fit(self) -> None:
        with pytest.raises(ConfigurationError, match="share the RATE stage"):
            Pipeline([Recorder("rate-limit", Stage.RATE, []),
                      Recorder("rate-limit", Stage.RATE, [])])

    def test_singleton_with_exclusive_on_one_task_is_refused(self, app: Any) -> None:
        """Stacking both exclusivity guards is a clash found when the pipeline is built."""
        from resilience.locks import exclusive, singleton

        @app.task(tier="critical", name="tests.pipeline.clash")
        @singleton(key="{key}")
        @exclusive(key="{key}")
        def clash(key: str) -> None:  # pragma: no cover - never runs
            return None

        with pytest.raises(ConfigurationError, match="'exclusive', 'singleton'|'singleton', "
                           "'exclusive'"):
            clash.pipelines()


class Taker(EnqueueGuard):
    def __init__(self, name: str, stage: EnqueueStage, log: list[str], *,
                 refuse: bool = False) -> None:
        self.name = name  # type: ignore[misc]
        self.stage = stage  # type: ignore[misc]
        self.log = log
        self.refuse = refuse

    def before_publish(self, publish: Publish) -> None:
        self.log.append(f"take {self.name}")
        if self.refuse:
            raise Stop(Outcome.DISCARDED, guard=self.name, reason="full", result="discarded")

    def give_back(self, publish: Publish, error: BaseException) -> None:
        self.log.append(f"give-back {self.name}: {type(error).__name__}")

    def after_publish(self, publish: Publish, result: Any) -> None:
        self.log.append(f"published {self.name}")


def _publish() -> Publish:
    return Publish(task=None, args=(), kwargs={}, options={})  # type: ignore[arg-type]


class TestEnqueueUnwind:
    def test_a_refusal_gives_back_what_earlier_guards_took(self) -> None:
        log: list[str] = []
        pipeline = EnqueuePipeline([Taker("unique", EnqueueStage.UNIQUE, log),
                                    Taker("bulkhead", EnqueueStage.ADMIT, log, refuse=True)])
        with pytest.raises(Stop):
            pipeline.run(_publish(), lambda publish: log.append("sent"))
        assert log == ["take unique", "take bulkhead", "give-back unique: Stop"]

    def test_a_failed_publish_gives_everything_back(self) -> None:
        log: list[str] = []
        pipeline = EnqueuePipeline([Taker("unique", EnqueueStage.UNIQUE, log),
                                    Taker("bulkhead", EnqueueStage.ADMIT, log)])

        def send(publish: Publish) -> None:
            raise ConnectionError("broker down")

        with pytest.raises(ConnectionError):
            pipeline.run(_publish(), send)
        assert log[-2:] == ["give-back bulkhead: ConnectionError",
                            "give-back unique: ConnectionError"]

    def test_a_publish_keeps_what_was_taken(self) -> None:
        log: list[str] = []
        pipeline = EnqueuePipeline([Taker("unique", EnqueueStage.UNIQUE, log)])
        pipeline.run(_publish(), lambda publish: log.append("sent"))
        assert log == ["take unique", "sent", "published unique"]
