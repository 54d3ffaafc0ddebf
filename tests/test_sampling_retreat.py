"""A sampling chain that reaches a state from which every step diverges goes back to a draw it
kept before, and the end of the run says so.

Found on the demo's sinusoid network (1-10-10-1, tanh, 32 rows), SGHMC with its defaults through
``run_chains`` (4 chains x 500 draws after 200): with seeds 2 and 4 of 0-5 a chain deep in its
sampling phase (steps 40,214 and 48,760 of 54,000) grew an oscillation whose potential doubled
at each step (183, 192, 208, 254, 369, 697, 1127 nats), every step below the blow-up threshold
of 1,000 nats, and from there every step blew up: going back one step could not help, and after
100 in a row the run raised :class:`~pyro_sgmcmc.SamplerDivergedError`. The chain now goes back
to an earlier kept draw after every 10 divergent steps in a row, with the same frozen step.
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import pyro
import pyro.distributions as dist
import pytest
import torch

from pyro_sgmcmc import SGLD, run_chains
from pyro_sgmcmc.engine.divergence import RETREAT_EVERY
from pyro_sgmcmc.engine.thinning import RETREAT_DEPTH, DrawCadence
from pyro_sgmcmc.errors import SamplerWarning
from pyro_sgmcmc.inference.checkpoint import ResumableMCMC

Y = torch.zeros(10)
#: Where the wall stands, in prior standard deviations.
WALL = 2.0


def wall_model(y):
    """A standard normal with a wall at :data:`WALL` whose curvature (``2e6``) no step of 0.1 can
    follow: a state up to ~0.03 beyond it is accepted (its potential rises by less than the
    blow-up threshold), and every step from there blows up."""
    x = pyro.sample("x", dist.Normal(0.0, 1.0))
    pyro.factor("wall", -1e6 * torch.relu(x - WALL) ** 2)
    with pyro.plate("data", y.shape[0]):
        pyro.sample("obs", dist.Normal(x, 10.0), obs=y)


def _kernel():
    return SGLD(wall_model, step_size=0.1, num_steps_per_sample=5, seed=0)


def test_a_chain_stuck_while_sampling_goes_back_and_is_named():
    with pytest.warns(SamplerWarning, match="sent back to a draw it had kept") as record:
        result = run_chains(_kernel(), Y, num_chains=2, num_samples=600, warmup_steps=0)
    named = {
        message.split()[1]
        for message in (str(w.message) for w in record)
        if "sent back to a draw" in message
    }
    assert named == {"0", "1"}
    x = result.samples["x"]
    assert x.shape == (2, 600) and torch.isfinite(x).all()
    # never further beyond the wall than a state the blow-up threshold accepts
    assert float(x.max()) < WALL + 0.05
    # the rest is the standard normal's bulk (sd of a mean of 1200 correlated draws < 0.1)
    assert abs(float(x.mean())) < 0.4
    # the stuck stretches are marked, and none lasted the 100 steps that raise
    diverging = torch.as_tensor(result.sample_stats["diverging"])
    assert 0 < int(diverging.sum()) < 0.2 * diverging.numel()


def _fake_engine(position: float, diverged: bool):
    monitor = SimpleNamespace(
        draw_diverged=torch.tensor([diverged]), start_draw=lambda: None, chain_ids=[0]
    )
    control = SimpleNamespace(step_size=lambda t: 0.1, unit_step=lambda engine: None)
    return SimpleNamespace(
        monitor=monitor,
        position=torch.tensor([[position]]),
        fixed={},
        value=torch.tensor([0.0]),
        control=control,
        t=0,
        num_chains=1,
    )


def test_the_retreat_point_is_the_oldest_of_the_last_good_kept_draws():
    cadence = DrawCadence([1])
    assert cadence.retreat_point(0) is None
    for position, diverged in [(1.0, False), (2.0, False), (3.0, False), (4.0, True)]:
        cadence.after_step(_fake_engine(position, diverged), sampling=True)
    # 4.0's draw had a divergent step: not a place to go back to; of 2.0 and 3.0, the older
    assert RETREAT_DEPTH == 2
    assert float(cadence.retreat_point(0)["flat"]) == 2.0
    saved = cadence.state_dict()
    again = DrawCadence([1])
    again.load_state_dict(saved)
    assert float(again.retreat_point(0)["flat"]) == 2.0


def test_a_run_interrupted_after_a_retreat_resumes_bit_for_bit(tmp_path):
    pyro.set_rng_seed(3)
    reference = ResumableMCMC(_kernel(), 300, warmup_steps=0, disable_progbar=True)
    with pytest.warns(SamplerWarning, match="sent back to a draw") as record:
        reference.run(Y)
    message = next(str(w.message) for w in record if "sent back" in str(w.message))
    first_retreat = int(re.search(r"at step\(s\) (\d+)", message).group(1))
    stop = 250  # draws, 5 steps each: the run stops after its first retreat
    assert first_retreat < 5 * stop
    calls = []

    def stop_late(kernel, params, stage, i):
        calls.append(stage)
        if len(calls) == stop:
            raise KeyboardInterrupt

    path = tmp_path / "run.ckpt"
    pyro.set_rng_seed(3)
    interrupted = ResumableMCMC(
        _kernel(), 300, warmup_steps=0, disable_progbar=True, hook_fn=stop_late,
        checkpoint_path=path, checkpoint_every=7,
    )  # fmt: skip
    with pytest.raises(KeyboardInterrupt), pytest.warns(UserWarning, match="interrupted"):
        interrupted.run(Y)
    pyro.set_rng_seed(1234)
    with pytest.warns(SamplerWarning, match="sent back to a draw"):
        resumed = ResumableMCMC.resume(path, _kernel(), Y, disable_progbar=True)
    torch.testing.assert_close(
        resumed.get_samples()["x"], reference.get_samples()["x"], rtol=0, atol=0
    )
    assert resumed.diagnostics()["divergent_steps"] == reference.diagnostics()["divergent_steps"]
    assert RETREAT_EVERY == 10
