"""The zoo's scenarios, one module per bug family; each module lists its ``Scenario``s."""

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Scenario:
    name: str  # its trace set lands in OUT/<name>
    world: int  # runs on launch ranks 0..world-1
    run: Callable  # run(ranks, out_dir) on each of those ranks


from . import experts, grad_norm_logging, hsdp, sequence  # noqa: E402

SCENARIOS = [*sequence.SCENARIOS, *experts.SCENARIOS, *hsdp.SCENARIOS, *grad_norm_logging.SCENARIOS]
