"""The guard of one rank: what the recorder hands it (every record, the optimizer-step StepInfo, the end of
each step), judged a step at a time, and what a violation does.

The training thread only takes the step's values at the sketch's positions (:mod:`.observe`); the exchange
between ranks and the judging run on the guard's thread (:mod:`.exchange`), and what they found is said in the
training thread at a later step's end (at the latest at ``close()``): a line on stderr per violation, an event
in the log, ``on_violation`` called. With ``on_violation="raise"`` a step's end waits for its judgement and
raises :class:`GuardViolation` out of the optimizer step that violated.

The guard never takes training down: it adds no collective to the training's, its exchange never makes the
training thread wait (except under "raise"), a failed exchange (a rank that died or never sent) or an internal
error disables it on this rank with one warning, and ``close()`` waits at most ``timeout`` for the last step's
exchange.
"""

from __future__ import annotations

import json
import math
import os
import queue
import sys
import threading

from .. import _gtcodec
from ..codec.trace import _run_info_to_json
from . import events, measure
from .events import EventLog
from .exchange import Exchange
from .observe import SKETCH_K, Positions, StepRecords

ON_VIOLATION = ("warn", "raise")
ALWAYS_CHECKED = 4  # the first steps are checked whatever ``every`` says


class GuardViolation(RuntimeError):
    """A step the guard found wrong, under ``on_violation="raise"``: ``step``, ``violations`` (dicts with
    ``check``, ``cause``, ``message``, ``params``, ``buckets``), the message their lines."""

    def __init__(self, step: int, violations: list[dict], lines: list[str]):
        super().__init__("\n".join(lines))
        self.step, self.violations = step, violations


def check_on_violation(on_violation) -> None:
    if not callable(on_violation) and on_violation not in ON_VIOLATION:
        raise ValueError(f"on_violation={on_violation!r}: expected 'warn', 'raise' or a callable")


class Guard:
    """``recorder``: the rank's RankRecorder (its run_info, layout, rank). ``every``: after the first
    ALWAYS_CHECKED steps, check every ``every``-th step; ``timeout``: seconds the exchange waits for a rank
    (and close() for the last step's exchange); ``k``: sketch positions per parameter."""

    def __init__(self, recorder, out_dir, *, on_violation="warn", every: int = 1, timeout: float = 60.0,
                 k: int = SKETCH_K, reference=None):
        check_on_violation(on_violation)
        # A trusted run's trace (stats suffice): each of its steps compared with this run's (ValueError, one line)
        self.reference = _gtcodec.ReferenceRun(os.fspath(reference)) if reference is not None else None
        if int(every) < 1:
            raise ValueError(f"guard_every={every!r}: expected an integer >= 1")
        self.on_violation, self.every, self.timeout = on_violation, int(every), float(timeout)
        self.rank, self.world = recorder.layout.rank, recorder.layout.world
        run = recorder.run_info
        self._run_judge = _gtcodec.RunJudge(_run_info_to_json(run), self.world)  # the RunInfo parsed once
        self._numels = [math.prod(int(d) for d in p["shape"]) for p in run["params"]]
        self._names = [p["name"] for p in run["params"]]
        self.positions = Positions(self._names, self._numels, k)
        self.groups = {name: list(ranks) for name, ranks in recorder.layout.groups.items()}
        self._over: dict[str, bool] = {}
        self.log = EventLog(events.log_path(out_dir, self.rank), self.rank)
        self._step = 0  # the optimizer step being recorded
        self._records = self._new_records()
        self._results: queue.Queue = queue.Queue()
        self._nonfinite_seen: set = set()
        self._said: set = set()  # (check, message) of the violations said on stderr
        self._said_scope: set = set()  # the checks a scope note was given for
        self._scope_later: list = []  # (check, why) found on the guard's thread, logged on the training thread
        self._left_reference: int | None = None  # the step this run first differed from the reference at (guard thread)
        self.disabled: str | None = None
        self.summary = {"steps_checked": 0, "violations": 0, "by_check": {}, "first": None,
                        "bytes_sent_per_step": 0, "every": self.every}
        self._closed = False
        self.exchange = Exchange(self.world, self.timeout)
        self.log.write("attach", world=self.world, sketch_k=k, every=self.every, timeout_s=self.timeout,
                       on_violation=on_violation if isinstance(on_violation, str) else "callable",
                       checks=["divisor", "replicas", "grad-norm", "non-finite", "skipped-step"]
                       + (["reference"] if self.reference is not None else []),
                       reference_steps=list(self.reference.steps) if self.reference is not None else [])
        if self.every > 1:
            self.log.write("scope", check="sampling", message=f"from step {ALWAYS_CHECKED} on, one step in "
                                                              f"{self.every} is checked (those divisible by {self.every})")
        if self.world == 1:
            self._scope("replicas", "one rank: no replica to compare")
        if not {"PRE_REDUCE", "POST_REDUCE"} <= set(recorder.phases):
            self._scope("divisor", f"phases={sorted(recorder.phases)} leaves out PRE_REDUCE or POST_REDUCE")
        if "FINAL" not in recorder.phases:
            self._scope("replicas", "phases leaves out FINAL")
            self._scope("grad-norm", "phases leaves out FINAL")

    # ---- what the recorder hands over (training thread) -----------------------------------------

    def _new_records(self) -> StepRecords:
        return StepRecords(self.positions, moments=self.reference is not None)

    def checking(self, step: int) -> bool:
        """Whether step ``step`` is checked (not disabled; sampled in)."""
        return self.disabled is None and (step < ALWAYS_CHECKED or step % self.every == 0)

    def observe_bucket(self, record: dict) -> None:
        if not self.checking(int(record.get("step", 0))):
            return
        try:
            self._records.add(record)
        except Exception as e:  # noqa: BLE001 - the guard never takes training down
            self._internal_error(e)

    def observe_step(self, frame: dict) -> None:
        """A StepInfo: the optimizer step's reported grad norm. One that arrives after its step ended (the Hugging
        Face Trainer logs it at the next log event) is not judged: its step's FINAL is gone, said once."""
        if frame.get("optimizer_step") and frame.get("reported_grad_norm") is not None:
            if int(frame.get("step", self._step)) != self._step:
                self._scope("grad-norm", "the framework reports its grad norm after the step ended (e.g. the Hugging "
                                         "Face Trainer's logs), when that step's gradients are no longer held")
                return
            self._records.reported_norm = float(frame["reported_grad_norm"])

    def step_ended(self, step: int, skipped: bool = False) -> None:
        """The optimizer step ``step`` ended (``skipped``: the optimizer did not step): its records go to the
        exchange and the judge; what earlier steps' judgements found is said now."""
        records, self._records = self._records, self._new_records()
        self._step = step + 1
        if self.checking(step):
            done = threading.Event()
            try:
                records.finish()
                sent = measure.payload(self.rank, step, skipped, records, self.groups, records.reported_norm)
                self.exchange.submit(sent, lambda payloads, nbytes, error: self._judge(step, records, payloads,
                                                                                      nbytes, error, done))
            except Exception as e:  # noqa: BLE001
                self._internal_error(e)
            else:
                if self.on_violation == "raise":
                    done.wait(self.timeout + 5)
        self._say()

    def close(self) -> dict:
        """Waits (at most ``timeout``) for the steps still being judged, says what they found, writes the summary
        to the log and (with violations, or on rank 0) one line on stderr; returns the summary. Idempotent."""
        if self._closed:
            return self.summary
        self._closed = True
        finished = self.exchange.close(self.timeout)
        if not finished and self.disabled is None:
            self._disable("the last step's exchange did not finish within the guard's timeout "
                          f"({self.timeout:g} s): a rank did not send it")
        try:
            self._say()
        finally:
            s = self.summary
            self.log.write("summary", **s, disabled=self.disabled)
            self.log.close()
            if s["violations"] or self.rank == 0:
                first = f" (the first at step {s['first']['step']}: {s['first']['message']})" if s["first"] else ""
                sys.stderr.write(_gtcodec.terminal_safe(
                    f"gradtrace guard: rank {self.rank}: {s['steps_checked']} step{'s' * (s['steps_checked'] != 1)} checked, "
                    f"{s['violations']} violation{'s' * (s['violations'] != 1)}{first}; log {self.log.path}") + "\n")
                sys.stderr.flush()
        return self.summary

    # ---- the guard's thread ---------------------------------------------------------------------

    def _judge(self, step, records, payloads, nbytes, error, done) -> None:
        try:
            if error is not None:
                self._results.put(("failed", step, f"the exchange of step {step} failed ({error})"))
                return
            self._results.put(("judged", step, self._measure_and_judge(step, records, payloads), nbytes))
        except Exception as e:  # noqa: BLE001 - said in the training thread
            self._results.put(("error", step, e))
        finally:
            done.set()

    def _over_replicas(self, group: str) -> bool:
        if group not in self._over:
            self._over[group] = bool(self._run_judge.sums_over_replicas(group))
        return self._over[group]

    def _measure_and_judge(self, step, records, payloads) -> dict:
        by_rank = {int(p["rank"]): p for p in payloads}
        mine = by_rank[self.rank]
        skipped = sorted(r for r, p in by_rank.items() if p["skipped"])
        m = {"reductions": measure.reductions(self.rank, by_rank, records, self.positions, self._over_replicas),
             "replicas": measure.replicas(self.rank, by_rank, self.positions),
             "nonfinite": measure.nonfinite(self.rank, records, self._nonfinite_seen),
             "skipped": skipped if skipped and len(skipped) < len(by_rank) and self.rank == min(by_rank) else []}
        m.update(self._norms(by_rank, mine))
        # The reference is compared by the lowest rank (as the norm), until the run first differs from it: its later
        # steps start from other weights.
        against = (self.reference is not None and self.rank == min(by_rank) and self._left_reference is None)
        compared = against and step in self.reference.steps
        mine_json, _, found = self._run_judge.judge(
            step, m, self.reference if compared else None,
            measure.final_moments(by_rank, self._numels, self._names) if compared else {})
        report = json.loads(mine_json)
        report["_violations"] = found  # diff/report/violations.h: the self report's, then the reference's
        if compared:
            if any(v["check"] == "reference" for v in found):
                self._left_reference = step
                self._scope_later.append(("reference", f"the run differs from the reference at step {step}: later "
                                                       "steps start from other weights and are not compared"))
        elif against:
            self._scope_later.append(("reference", f"the reference recorded FINAL at steps "
                                                   f"{list(self.reference.steps)[:8]}: later steps are not compared"))
        report["_nothing_to_judge"] = [c for c, empty in (("divisor", not any(e["phase"] == "POST_REDUCE"
                                                                                for e in records.entries)),
                                                          ("grad-norm", mine["reported_norm"] is None)) if empty]
        return report

    def _norms(self, by_rank, mine) -> dict:
        """The reported norm against FINAL's (said by the lowest rank only); a norm the framework took before
        clipping (it matches the reduced gradients, FINAL is smaller) is no violation."""
        reported = mine["reported_norm"]
        if reported is None or self.rank != min(by_rank):
            return {}
        final = measure.final_norm(by_rank, self._numels)
        if final is not None and final > 0 and reported / final > 1 + 1e-3:
            # Clipping after the norm is taken makes FINAL smaller than what is reported. The reduced gradients
            # before it (POST) tell the two apart; without them a larger reported norm cannot be judged.
            before = measure.post_norm(by_rank, self._numels)
            if before is None:
                self._scope_later.append(("grad-norm", "a reported norm above FINAL's cannot be told from clipping "
                                                       "without POST_REDUCE records"))
                return {}
            if abs(reported / before - 1) <= 1e-3:
                return {}
        return {"reported_norm": reported, "final_norm": final}

    # ---- said in the training thread ------------------------------------------------------------

    def _say(self) -> None:
        raised = None
        while True:
            try:
                item = self._results.get_nowait()
            except queue.Empty:
                break
            kind, step = item[0], item[1]
            if kind == "failed":
                self._disable(item[2])
            elif kind == "error":
                self._internal_error(item[2])
            else:
                raised = self._judged(step, item[2], item[3]) or raised
        if raised is not None:
            raise raised

    def _judged(self, step, report, nbytes):
        s = self.summary
        s["steps_checked"] += 1
        s["bytes_sent_per_step"] = max(s["bytes_sent_per_step"], int(nbytes))
        while self._scope_later:
            self._scope(*self._scope_later.pop(0))
        for check in report.get("_nothing_to_judge", []):
            self._scope(check, "nothing recorded to judge it by (" + ("no POST_REDUCE records: the reductions run "
                        "where no hook sees them, e.g. inside DTensor's autograd" if check == "divisor" else
                        "the framework reported no grad norm: pass it with cap.report_grad_norm()") + ")")
        found = []
        for v in report["_violations"]:
            if v["cause"] == "lossy-compression":  # no divisor to claim for an approximated sum: not a violation
                self._scope("divisor", "the reductions approximate the sum: " + v["message"])
            else:
                found.append(v)
        if not found:
            return None
        lines = [_gtcodec.guard_line(self.rank, step, v) for v in found]
        for v, text in zip(found, lines):
            self.log.write("violation", step=step, **{k: v.get(k) for k in ("check", "cause", "message", "params",
                                                                               "buckets", "divisor")})
            s["violations"] += 1
            s["by_check"][v["check"]] = s["by_check"].get(v["check"], 0) + 1
            if s["first"] is None:
                s["first"] = {"step": step, "check": v["check"], "message": v["message"]}
            repeat = (v["check"], v["message"]) in self._said
            self._said.add((v["check"], v["message"]))
            if self.on_violation == "warn" and not repeat:  # a repeat is logged and counted, not said again
                sys.stderr.write(text + "\n")
        sys.stderr.flush()
        if callable(self.on_violation):
            self.on_violation(step, found)
        elif self.on_violation == "raise":
            return GuardViolation(step, found, lines)
        return None

    def _scope(self, check: str, why: str) -> None:
        if check in self._said_scope:
            return
        self._said_scope.add(check)
        message = f"{check} is not checked: {why}"
        self.log.write("scope", check=check, message=message)
        if self.rank == 0:  # never silently: once, on one rank
            sys.stderr.write(_gtcodec.terminal_safe(f"gradtrace guard: note: {message}") + "\n")

    def _disable(self, why: str) -> None:
        if self.disabled is not None:
            return
        self.disabled = why
        self.log.write("disabled", message=why)
        sys.stderr.write(_gtcodec.terminal_safe(f"gradtrace guard: WARNING: rank {self.rank}: guard disabled: {why}; "
                                                "training continues without it") + "\n")
        sys.stderr.flush()

    def _internal_error(self, error: Exception) -> None:
        if self.on_violation == "raise":
            raise error
        self._disable(f"internal error: {type(error).__name__}: {error}")
