"""Checkpoints: resuming, extending and interrupting a run reproduce the uninterrupted run bit
for bit; files from another model, kernel, data set or format version are refused."""

from __future__ import annotations

import os
import signal

import arviz as az
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC
from pyro.infer.mcmc.api import StreamingMCMC

from pyro_sgmcmc import PSGLD, SGHMC, SGLD, ConstantSGD, _arviz, to_inference_data
from pyro_sgmcmc.inference.checkpoint import (
    FORMAT_VERSION,
    CheckpointError,
    ResumableMCMC,
    load_checkpoint,
    save_checkpoint,
)
from pyro_sgmcmc.inference.checkpoint_files import check_signature
from pyro_sgmcmc.inference.schedules import CyclicalCosine


def model(y):
    mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
    sigma = pyro.sample("sigma", dist.LogNormal(0.0, 1.0))
    with pyro.plate("data", y.shape[0]) as idx:
        pyro.sample("obs", dist.Normal(mu, sigma), obs=y[idx])


def other_model(y):
    loc = pyro.sample("loc", dist.Normal(0.0, 10.0))
    sigma = pyro.sample("sigma", dist.LogNormal(0.0, 1.0))
    with pyro.plate("data", y.shape[0]) as idx:
        pyro.sample("obs", dist.Normal(loc, sigma), obs=y[idx])


def vector_model(y):
    mu = pyro.sample("mu", dist.Normal(torch.zeros(2), 10.0).to_event(1))
    sigma = pyro.sample("sigma", dist.LogNormal(0.0, 1.0))
    with pyro.plate("data", y.shape[0]) as idx:
        pyro.sample("obs", dist.Normal(mu.sum(), sigma), obs=y[idx])


Y = torch.randn(40, generator=torch.Generator().manual_seed(1)) * 1.5 + 2.0

KERNELS = {
    "sgld": lambda **kw: SGLD(model, step_size=2e-3, batch_size=8, num_steps_per_sample=3, **kw),
    # Euler's step has no noise in its state (the default's last draw is: a resumed chain
    # must reuse it, for SGLD and pSGLD)
    "sgld_euler": lambda **kw: SGLD(
        model, step_size=2e-3, batch_size=8, num_steps_per_sample=3, integrator="euler", **kw
    ),
    "sghmc": lambda **kw: SGHMC(
        model,
        step_size=5e-4,
        friction=0.2,
        gradient_noise="estimate",
        resample_momentum_every=7,
        momentum_persistence=0.5,
        batch_size=8,
        num_steps_per_sample=3,
        **kw,
    ),
    "psgld": lambda **kw: PSGLD(
        model,
        step_size=CyclicalCosine(1e-2, cycle_length=10),
        batch_size=8,
        num_steps_per_sample=2,
        **kw,
    ),
    "constant_sgd": lambda **kw: ConstantSGD(
        model, step_size=1e-3, batch_size=8, preconditioner="diagonal", **kw
    ),
}
WARMUP, SAMPLES = 6, 10


class Stop(Exception):
    """Raised by a hook to stop a run at a given draw."""


def stop_at(count: int, exception: type[BaseException] = KeyboardInterrupt):
    calls = []

    def hook(kernel, params, stage, i):
        calls.append(stage)
        if len(calls) == count:
            raise exception

    return hook


#: Diagnostics that are seconds of wall time: a resumed run's differ from an uninterrupted one's.
TIMINGS = ("setup_seconds", "sampling_seconds")


def assert_same(a, b, path="diagnostics"):
    """Exact equality of nested dicts, lists and tensors (wall times only present in both)."""
    if path.endswith(tuple(f"[{key!r}]" for key in TIMINGS)):
        assert isinstance(a, float) and isinstance(b, float), path
    elif isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype, path
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True, msg=path)
    elif isinstance(a, dict):
        assert set(a) == set(b), path
        for key in a:
            assert_same(a[key], b[key], f"{path}[{key!r}]")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and a != a:
        assert b != b, path
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def assert_same_run(reference: ResumableMCMC, other: ResumableMCMC):
    assert_same(
        reference.get_samples(group_by_chain=True), other.get_samples(group_by_chain=True), "draws"
    )
    assert_same(reference._diagnostics, other._diagnostics)


def uninterrupted(name, num_chains=2, seeded=True, num_samples=SAMPLES):
    pyro.set_rng_seed(3)
    kernel = KERNELS[name](seed=11 if seeded else None)
    mcmc = ResumableMCMC(
        kernel, num_samples, warmup_steps=WARMUP, num_chains=num_chains, disable_progbar=True
    )
    mcmc.run(Y)
    return mcmc


@pytest.mark.parametrize("name", sorted(KERNELS))
@pytest.mark.parametrize(
    ("stop", "seeded"),
    [(4, True), (WARMUP + SAMPLES + 3, False), (WARMUP + SAMPLES, False)],
    ids=["warmup-chain0", "sampling-chain1-unseeded", "end-of-chain0-unseeded"],
)
def test_interrupted_and_resumed_run_is_bit_identical(tmp_path, name, stop, seeded):
    reference = uninterrupted(name, seeded=seeded)
    path = tmp_path / "run.ckpt"
    pyro.set_rng_seed(3)
    mcmc = ResumableMCMC(
        KERNELS[name](seed=11 if seeded else None),
        SAMPLES,
        warmup_steps=WARMUP,
        num_chains=2,
        hook_fn=stop_at(stop),
        disable_progbar=True,
        checkpoint_path=path,
        checkpoint_every=5,
    )
    with pytest.raises(KeyboardInterrupt), pytest.warns(UserWarning, match="interrupted"):
        mcmc.run(Y)
    assert mcmc.interrupted
    per_chain = WARMUP + SAMPLES
    expected = sum(max(min(stop - c * per_chain, per_chain) - WARMUP, 0) for c in range(2))
    assert sum(len(chain["mu"]) for chain in mcmc.collected_samples()) == expected
    pyro.set_rng_seed(1234)  # the saved global random state must win over whatever is set now
    resumed = ResumableMCMC.resume(
        path, KERNELS[name](seed=11 if seeded else None), Y, disable_progbar=True
    )
    assert_same_run(reference, resumed)
    assert not list(tmp_path.glob("*.tmp")), "a temporary file was left behind"


def test_a_run_stopped_while_the_warmup_measures_its_thinning_resumes_bit_identically(tmp_path):
    """With nothing given the warm-up takes 4,000 gradient steps (6 draws of 667) and measures
    the thinning over its last quarter: stopped after 5 warm-up draws (step 3,335, with 314
    steps of the measurement recorded), the resumed run equals the uninterrupted one."""

    def make():
        return SGHMC(model, batch_size=8, seed=11)

    pyro.set_rng_seed(3)
    reference = ResumableMCMC(make(), SAMPLES, warmup_steps=WARMUP, disable_progbar=True)
    reference.run(Y)
    path = tmp_path / "run.ckpt"
    pyro.set_rng_seed(3)
    mcmc = ResumableMCMC(make(), SAMPLES, warmup_steps=WARMUP, hook_fn=stop_at(5),
                         disable_progbar=True, checkpoint_path=path)  # fmt: skip
    with pytest.raises(KeyboardInterrupt), pytest.warns(UserWarning, match="interrupted"):
        mcmc.run(Y)
    resumed = ResumableMCMC.resume(path, make(), Y, disable_progbar=True)
    assert_same_run(reference, resumed)
    assert (
        resumed.diagnostics()["num_steps_per_sample"]
        == reference.diagnostics()["num_steps_per_sample"]
    )


def test_resumable_driver_draws_what_pyro_mcmc_draws():
    kernel = KERNELS["sghmc"](seed=5)
    pyro_run = MCMC(kernel, SAMPLES, warmup_steps=WARMUP, disable_progbar=True)
    pyro_run.run(Y)
    ours = ResumableMCMC(
        KERNELS["sghmc"](seed=5), SAMPLES, warmup_steps=WARMUP, disable_progbar=True
    )
    ours.run(Y)
    for site, value in pyro_run.get_samples(group_by_chain=True).items():
        torch.testing.assert_close(ours.get_samples(group_by_chain=True)[site], value)
    assert_same(pyro_run._diagnostics, ours._diagnostics)


@pytest.mark.parametrize("name", ["sgld", "sgld_euler", "sghmc", "psgld"])
def test_extend_equals_longer_run(tmp_path, name):
    reference = uninterrupted(name, seeded=False, num_samples=SAMPLES + 7)
    pyro.set_rng_seed(3)
    mcmc = ResumableMCMC(
        KERNELS[name](),
        SAMPLES,
        warmup_steps=WARMUP,
        num_chains=2,
        disable_progbar=True,
        checkpoint_path=tmp_path / "run.ckpt",
    )
    mcmc.run(Y)
    mcmc.extend(7)
    assert_same_run(reference, mcmc)
    # A finished run continues from its file too.
    again = ResumableMCMC.resume(tmp_path / "run.ckpt", KERNELS[name](), Y, disable_progbar=True)
    again.extend(0 + 1)
    assert again.get_samples(group_by_chain=True)["mu"].shape == (2, SAMPLES + 8)
    assert torch.equal(
        again.get_samples(group_by_chain=True)["mu"][:, : SAMPLES + 7],
        reference.get_samples(group_by_chain=True)["mu"],
    )


def test_ctrl_c_stops_at_a_draw_boundary_and_resumes(tmp_path):
    reference = uninterrupted("sghmc", num_chains=1)
    path = tmp_path / "run.ckpt"

    def send_sigint(kernel, params, stage, i):
        if stage == "Sample" and i == 3:
            os.kill(os.getpid(), signal.SIGINT)

    pyro.set_rng_seed(3)
    mcmc = ResumableMCMC(
        KERNELS["sghmc"](seed=11),
        SAMPLES,
        warmup_steps=WARMUP,
        hook_fn=send_sigint,
        disable_progbar=True,
        checkpoint_path=path,
    )
    with pytest.raises(KeyboardInterrupt), pytest.warns(UserWarning, match="checkpoint"):
        mcmc.run(Y)
    (partial,) = mcmc.collected_samples()
    assert partial["sigma"].shape == (4,)
    assert torch.equal(partial["sigma"], reference.get_samples()["sigma"][:4])
    assert load_checkpoint(path)["chains"][0]["kernel_state"]["num_draws"] == WARMUP + 4
    # Resume on the same object.
    mcmc.hook_fn = None
    mcmc.run(Y, resume_from=path)
    assert_same_run(reference, mcmc)


def test_other_exceptions_keep_the_draws_and_the_last_checkpoint(tmp_path):
    path = tmp_path / "run.ckpt"
    mcmc = ResumableMCMC(
        KERNELS["sgld"](seed=1),
        SAMPLES,
        warmup_steps=WARMUP,
        hook_fn=stop_at(WARMUP + 7, Stop),
        disable_progbar=True,
        checkpoint_path=path,
        checkpoint_every=10,
    )
    with pytest.raises(Stop):
        mcmc.run(Y)
    assert mcmc.collected_samples()[0]["mu"].shape == (7,)
    assert load_checkpoint(path)["chains"][0]["kernel_state"]["num_draws"] == 10
    # a kernel with another seed would continue another chain: refused, naming the seed
    with pytest.raises(CheckpointError, match=r"config\.seed: saved '1', now '11'"):
        ResumableMCMC.resume(path, KERNELS["sgld"](seed=11), Y, disable_progbar=True)
    resumed = ResumableMCMC.resume(path, KERNELS["sgld"](seed=1), Y, disable_progbar=True)
    seeded = ResumableMCMC(
        KERNELS["sgld"](seed=1), SAMPLES, warmup_steps=WARMUP, disable_progbar=True
    )
    seeded.run(Y)
    assert_same_run(seeded, resumed)


def test_results_work_with_pyro_arviz_and_export():
    mcmc = uninterrupted("sgld", num_chains=2)
    assert mcmc.get_samples()["sigma"].shape == (2 * SAMPLES,)
    assert (mcmc.get_samples()["sigma"] > 0).all()
    diagnostics = mcmc.diagnostics()
    assert set(diagnostics["divergences"]) == {"chain 0", "chain 1"}
    assert "r_hat" in diagnostics["mu"]
    mcmc.summary()
    idata = to_inference_data(mcmc, model, Y)
    assert idata.posterior["mu"].shape == (2, SAMPLES)
    if not _arviz.ARVIZ_1:  # ArviZ 1.x has no from_pyro (to_inference_data serves both lines)
        assert az.from_pyro(mcmc, log_likelihood=False).posterior["sigma"].shape == (2, SAMPLES)


def test_draw_dtype_and_keep_draws_false_hold_less(tmp_path):
    kernel = KERNELS["sgld"](seed=2, keep_draws=False)
    mcmc = ResumableMCMC(
        kernel, SAMPLES, warmup_steps=WARMUP, disable_progbar=True, draw_dtype=torch.float16
    )
    mcmc.run(Y)
    assert mcmc.get_samples()["mu"].dtype == torch.float16
    full = ResumableMCMC(
        KERNELS["sgld"](seed=2), SAMPLES, warmup_steps=WARMUP, disable_progbar=True
    )
    full.run(Y)
    torch.testing.assert_close(
        mcmc.get_samples()["mu"].float(), full.get_samples()["mu"], rtol=1e-3, atol=1e-3
    )


def test_streaming_mcmc_with_keep_draws_false_holds_no_draws():
    kernel = SGLD(model, step_size=2e-3, batch_size=8, seed=0, keep_draws=False)
    seen = []
    streaming = StreamingMCMC(
        kernel,
        num_samples=20,
        warmup_steps=5,
        disable_progbar=True,
        hook_fn=lambda k, *_: seen.append(len(k.collected_draws())),
    )
    streaming.run(Y)
    assert set(seen) == {0}
    stats = streaming.get_statistics(group_by_chain=False)
    assert stats["sigma"]["mean"] > 0 and stats["sigma"]["count"] == 20
    assert streaming.diagnostics()["divergences"] == {"chain 0": []}


# ---------------------------------------------------------------------- refusals
@pytest.fixture
def saved(tmp_path):
    path = tmp_path / "run.ckpt"
    mcmc = ResumableMCMC(
        KERNELS["sgld"](seed=0),
        SAMPLES,
        warmup_steps=WARMUP,
        disable_progbar=True,
        checkpoint_path=path,
    )
    mcmc.run(Y)
    return path


@pytest.mark.parametrize(
    ("make_kernel", "data", "message"),
    [
        (
            lambda: SGLD(other_model, step_size=2e-3, batch_size=8, num_steps_per_sample=3, seed=0),
            Y,
            "latent_sites",
        ),
        (
            lambda: SGLD(
                vector_model, step_size=2e-3, batch_size=8, num_steps_per_sample=3, seed=0
            ),
            Y,
            r"latent_sites\.mu",
        ),
        (lambda: KERNELS["sgld"](seed=0), Y[:32], "data given to run"),
        (lambda: KERNELS["sgld"](seed=0), Y + 1, "data given to run"),
        (
            lambda: SGLD(model, step_size=1e-3, batch_size=8, num_steps_per_sample=3, seed=0),
            Y,
            r"config\.step_size: saved '0.002', now '0.001'",
        ),
        (lambda: KERNELS["psgld"](seed=0), Y, "kernel: saved 'SGLD', now 'PSGLD'"),
    ],
    ids=["site-names", "site-shapes", "data-size", "data-values", "step-size", "kernel-class"],
)
def test_checkpoint_of_another_model_or_kernel_is_refused(saved, make_kernel, data, message):
    with pytest.raises(CheckpointError, match=message):
        ResumableMCMC.resume(saved, make_kernel(), data, disable_progbar=True)


def test_other_run_settings_and_versions_are_refused(saved, tmp_path):
    mcmc = ResumableMCMC(KERNELS["sgld"](seed=0), SAMPLES + 1, warmup_steps=WARMUP)
    with pytest.raises(CheckpointError, match="num_samples=10, this one has num_samples=11"):
        mcmc.run(Y, resume_from=saved)
    payload = load_checkpoint(saved)
    payload["format_version"] = FORMAT_VERSION + 1
    save_checkpoint(payload, tmp_path / "future.ckpt")
    with pytest.raises(CheckpointError, match=f"version {FORMAT_VERSION + 1}"):
        load_checkpoint(tmp_path / "future.ckpt")
    torch.save({"weights": torch.zeros(2)}, tmp_path / "weights.pt")
    with pytest.raises(CheckpointError, match="not a pyro_sgmcmc checkpoint"):
        load_checkpoint(tmp_path / "weights.pt")
    (tmp_path / "garbage.ckpt").write_bytes(b"not a checkpoint at all")
    with pytest.raises(CheckpointError, match="not a pyro_sgmcmc checkpoint"):
        load_checkpoint(tmp_path / "garbage.ckpt")
    with pytest.raises(FileNotFoundError, match="no checkpoint file"):
        load_checkpoint(tmp_path / "missing.ckpt")


def test_a_flipped_byte_is_detected(saved, tmp_path):
    raw = bytearray(saved.read_bytes())
    for position in (len(raw) // 2, len(raw) - 10):  # inside the records, near the end
        damaged = bytearray(raw)
        damaged[position] ^= 0x01
        path = tmp_path / f"damaged-{position}.ckpt"
        path.write_bytes(bytes(damaged))
        with pytest.raises(CheckpointError, match="is damaged: its content does not match"):
            ResumableMCMC.resume(path, KERNELS["sgld"](seed=0), Y, disable_progbar=True)
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(bytes(raw[: len(raw) // 3]))
    with pytest.raises(CheckpointError, match="is damaged"):
        load_checkpoint(truncated)


def test_an_edited_checkpoint_missing_an_entry_is_named(saved, tmp_path):
    payload = load_checkpoint(saved)
    del payload["chains"]
    path = tmp_path / "edited.ckpt"
    save_checkpoint(payload, path)
    with pytest.raises(CheckpointError, match=r"lacks the entries \['chains'\]: it was edited"):
        ResumableMCMC.resume(path, KERNELS["sgld"](seed=0), Y, disable_progbar=True)


def test_nothing_is_overwritten_without_being_asked(saved, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("my results")
    with pytest.raises(CheckpointError, match="not a pyro_sgmcmc checkpoint: refusing to over"):
        ResumableMCMC(KERNELS["sgld"](seed=0), SAMPLES, checkpoint_path=notes)
    assert notes.read_text() == "my results"
    # a fresh run pointed at another run's checkpoint is refused before anything is drawn
    before = saved.read_bytes()
    fresh = ResumableMCMC(
        KERNELS["sgld"](seed=0), SAMPLES, warmup_steps=WARMUP, checkpoint_path=saved,
        disable_progbar=True,
    )  # fmt: skip
    with pytest.raises(CheckpointError, match="already holds the checkpoint of a run"):
        fresh.run(Y)
    assert saved.read_bytes() == before
    # ... unless asked to, or when the run resumes from it
    ResumableMCMC(
        KERNELS["sgld"](seed=0), SAMPLES, warmup_steps=WARMUP, checkpoint_path=notes,
        overwrite=True, disable_progbar=True,
    ).run(Y)  # fmt: skip
    assert load_checkpoint(notes)["run"]["num_samples"] == SAMPLES
    ResumableMCMC.resume(saved, KERNELS["sgld"](seed=0), Y, disable_progbar=True)
    # resume() takes overwrite=True too, as its refusal advises
    other = tmp_path / "other.txt"
    other.write_text("mine")
    with pytest.raises(CheckpointError, match=r"refusing to overwrite it .* overwrite=True"):
        ResumableMCMC.resume(saved, KERNELS["sgld"](seed=0), Y, checkpoint_path=other)
    assert other.read_text() == "mine"
    resumed = ResumableMCMC.resume(saved, KERNELS["sgld"](seed=0), Y, checkpoint_path=other,
                                   overwrite=True, disable_progbar=True)  # fmt: skip
    assert resumed.get_samples()["mu"].shape[0] == SAMPLES


def test_the_same_data_by_keyword_resume_the_run(saved):
    """Data passed by keyword to the model's positional parameter are the same data."""
    reference = ResumableMCMC.resume(saved, KERNELS["sgld"](seed=0), Y, disable_progbar=True)
    by_keyword = ResumableMCMC.resume(saved, KERNELS["sgld"](seed=0), y=Y, disable_progbar=True)
    assert torch.equal(by_keyword.get_samples()["mu"], reference.get_samples()["mu"])
    with pytest.raises(CheckpointError, match="data given to run"):
        ResumableMCMC.resume(saved, KERNELS["sgld"](seed=0), y=Y + 1, disable_progbar=True)


def test_temporary_files_of_a_killed_writer_are_removed(saved, tmp_path):
    stale = saved.parent / f".{saved.name}.abc123.tmp"
    stale.write_bytes(b"half a checkpoint")
    load_checkpoint(saved)
    assert not stale.exists()
    stale.write_bytes(b"half a checkpoint")
    save_checkpoint(load_checkpoint(saved), saved)
    assert not stale.exists()


def test_kernel_state_dict_round_trip_and_refusals():
    kernel = KERNELS["sghmc"](seed=0)
    kernel.setup(2, Y)
    params = kernel.initial_params
    for _ in range(4):
        params = kernel.sample(params)
    state = kernel.state_dict()
    next_draw = kernel.sample(params)
    fresh = KERNELS["sghmc"](seed=0)
    with pytest.raises(RuntimeError, match="setup"):
        fresh.load_state_dict(state)
    fresh.setup(2, Y)
    fresh.load_state_dict(state)
    again = fresh.sample(fresh.current_params)
    assert all(torch.equal(again[k], next_draw[k]) for k in next_draw)
    other = KERNELS["sghmc"](seed=0)
    other.setup(3, Y)
    with pytest.raises(CheckpointError, match="warmup_steps=2"):
        other.load_state_dict(state)
    with pytest.raises(CheckpointError, match="signature"):
        fresh.load_state_dict({"num_draws": 1})


def test_an_sghmc_checkpoint_from_before_its_integrator_option_ran_euler():
    """Checkpoints of SGHMC written before 0.4.0 have no ``integrator`` entry: they ran Chen et
    al.'s Euler step, so ``integrator="euler"`` continues them and the new default is refused
    by name."""
    saved = {"kernel": "SGHMC", "config": {"friction": "0.05"}}

    def current(integrator: str) -> dict:
        return {"kernel": "SGHMC", "config": {"friction": "0.05", "integrator": integrator}}

    check_signature(saved, current("'euler'"))
    message = r"config\.integrator: saved \"'euler'\", now \"'baoab'\""
    with pytest.raises(CheckpointError, match=message):
        check_signature(saved, current("'baoab'"))
