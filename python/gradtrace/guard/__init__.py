"""The live guard: ``gradtrace.attach(obj, out_dir, mode="guard")`` checks every optimizer step in the
training process, with no reference run and no gradient frames written.

Each step, every rank takes its records' values at a sketch's positions (the same elements on every
rank, ``_gtcodec.sketch_positions``) and their sums of squares (:mod:`.observe`), exchanges them in one
small collective on a group of its own, off the training thread (:mod:`.exchange`), turns them into
the measurements ``--self`` makes from a trace set (:mod:`.measure`), and has the one judging function
of ``--self`` judge them (``_gtcodec.RunJudge.judge``, diff/explain/self_judge.h): each reduction's divisor
against what the layout predicts, the replicas of FINAL, the reported grad norm, non-finite values, a
rank that skipped the step. A violation is a line on stderr in the diff's words, an event in
``out_dir/rank-NNNNN.guard.jsonl`` (:mod:`.events`), a summary at ``close()``; ``on_violation``
decides what else happens (:mod:`.guard`).
"""

from .guard import Guard, GuardViolation

__all__ = ["Guard", "GuardViolation"]
