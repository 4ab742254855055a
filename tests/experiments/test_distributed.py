"""Data-parallel training under torchrun: environment detection, devices, the
global batch, the process group's life, and two gloo processes reproducing
one process's loss curve with a single set of files."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as tdist

from app.cli import build_parser, main
from app.commands.train import configs_from_args
from experiments.corpus import load_corpus
from experiments.distributed import (Dist, DistributedError, TorchrunEnv, backend_for, check_global_batch,
                                     process_group, resolve_device, torchrun_env)
from experiments.model import GPTConfig
from experiments.train import RESUME_FILE, TrainConfig, load_checkpoint, train

ROOT = Path(__file__).resolve().parents[2]
FULL_ENV = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1"}

# a tiny model, 8 steps, validation and a checkpoint at step 4
TRAIN_ARGS = ["--n-layer", "2", "--d-model", "32", "--n-head", "4", "--block-size", "32",
              "--steps", "8", "--batch-size", "8", "--warmup-steps", "2", "--eval-interval", "4",
              "--eval-batches", "2", "--log-interval", "2", "--save-steps", "4",
              "--corpus-max-bytes", "60000", "--device", "cpu"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _clear_torchrun_env(monkeypatch) -> None:
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE",
                "GROUP_RANK", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(var, raising=False)


def _single_process_env(monkeypatch) -> None:
    """The environment torchrun --nproc_per_node=1 gives its one worker."""
    _clear_torchrun_env(monkeypatch)
    for var, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(_free_port())}.items():
        monkeypatch.setenv(var, value)


def _rows(run: Path) -> list[dict]:
    return [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if ln.strip()]


def _strip(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "wall_time"} for r in rows]


# ---- environment, devices, backend, batch -------------------------------------------------

def test_torchrun_env_absent_full_partial_and_malformed():
    assert torchrun_env({}) is None
    assert torchrun_env({"PATH": "/bin"}) is None
    assert torchrun_env(FULL_ENV) == TorchrunEnv(rank=1, world_size=2, local_rank=1, master_addr="127.0.0.1")
    with pytest.raises(DistributedError) as e:
        torchrun_env({"RANK": "0", "WORLD_SIZE": "2"})
    assert str(e.value) == ("expected the torchrun environment variables RANK, WORLD_SIZE, LOCAL_RANK, "
                            "MASTER_ADDR all set or none, found RANK, WORLD_SIZE set and LOCAL_RANK, "
                            "MASTER_ADDR missing; start data-parallel training with torchrun "
                            "--nproc_per_node=N -m app train ...")
    with pytest.raises(DistributedError) as e:
        torchrun_env({**FULL_ENV, "WORLD_SIZE": "two"})
    assert str(e.value) == "expected an integer in the environment variable WORLD_SIZE, found 'two'"
    with pytest.raises(DistributedError) as e:
        torchrun_env({**FULL_ENV, "RANK": "2"})
    assert str(e.value) == ("expected 0 <= LOCAL_RANK <= RANK < WORLD_SIZE, found RANK=2, WORLD_SIZE=2, "
                            "LOCAL_RANK=1")


@pytest.mark.parametrize("device,local_rank,world,expected", [
    ("cpu", 1, 2, "cpu"),
    ("cuda", 0, 2, "cuda:0"),
    ("cuda", 3, 4, "cuda:3"),
    ("cuda:1", 0, 1, "cuda:1"),
])
def test_resolve_device(device, local_rank, world, expected):
    assert resolve_device(device, local_rank, world) == expected


def test_resolve_device_refused():
    with pytest.raises(DistributedError) as e:
        resolve_device("cuda:1", 0, 2)
    assert str(e.value) == ("expected --device cuda (each process takes cuda:LOCAL_RANK) or cpu under "
                            "torchrun with 2 processes, found --device cuda:1")
    with pytest.raises(DistributedError) as e:
        resolve_device("mps", 0, 2)
    assert str(e.value) == "expected --device cpu or cuda under torchrun, found --device mps"


def test_backend_nccl_for_cuda_else_gloo():
    assert [backend_for(d) for d in ("cpu", "cuda:0", "cuda:3")] == ["gloo", "nccl", "nccl"]


def test_global_batch_must_divide():
    assert check_global_batch(8, 2) == 4
    assert check_global_batch(8, 8) == 1
    with pytest.raises(DistributedError) as e:
        check_global_batch(10, 4)
    assert str(e.value) == ("expected --batch-size (the global batch, split over all processes) divisible "
                            "by the 4 processes, found 10 (remainder 2); use 8 or 12")
    with pytest.raises(DistributedError) as e:
        check_global_batch(3, 4)
    assert str(e.value).endswith("found 3 (remainder 3); use 4")


def test_shard_takes_this_ranks_rows_without_copying_the_batch():
    x = torch.arange(8 * 3).reshape(8, 3)  # (B=8, T=3)
    parts = [Dist(rank=r, world_size=4, local_rank=r, backend="gloo", device="cpu").shard(x) for r in range(4)]
    assert [p.shape for p in parts] == [torch.Size([2, 3])] * 4
    assert torch.equal(torch.cat(parts), x)
    assert torch.equal(x, torch.arange(8 * 3).reshape(8, 3))


# ---- the process group's life --------------------------------------------------------------

def test_no_process_group_outside_torchrun(monkeypatch):
    _clear_torchrun_env(monkeypatch)
    with process_group("cpu") as d:
        assert d is None
        assert not tdist.is_initialized()


def test_process_group_destroyed_on_exit_and_on_error(monkeypatch):
    _single_process_env(monkeypatch)
    with process_group("cpu") as d:
        assert tdist.is_initialized()
        assert (d.rank, d.world_size, d.backend, d.device, d.is_main) == (0, 1, "gloo", "cpu", True)
        assert d.all_mean([1.5, -2.0]) == [1.5, -2.0]
    assert not tdist.is_initialized()
    with pytest.raises(ZeroDivisionError):
        with process_group("cpu"):
            assert tdist.is_initialized()
            1 / 0
    assert not tdist.is_initialized()


def test_cli_refuses_a_partial_torchrun_environment(monkeypatch, tmp_path, capsys):
    _clear_torchrun_env(monkeypatch)
    monkeypatch.setenv("RANK", "0")
    assert main(["train", "--out", str(tmp_path / "r"), *TRAIN_ARGS]) == 2
    assert capsys.readouterr().err == (
        "error: expected the torchrun environment variables RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR "
        "all set or none, found RANK set and WORLD_SIZE, LOCAL_RANK, MASTER_ADDR missing; start "
        "data-parallel training with torchrun --nproc_per_node=N -m app train ...\n")
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_one_process_group_trains_exactly_like_no_group(monkeypatch, tmp_path):
    """DDP over a single gloo process: same metrics and weights as a plain run,
    the caller's TrainConfig untouched, the summary says world_size 1."""
    corpus = load_corpus(max_bytes=60_000)
    mc = GPTConfig(n_layer=1, d_model=16, n_head=2, block_size=16)
    tc = TrainConfig(steps=4, batch_size=4, warmup_steps=1, eval_interval=2, eval_batches=1, log_interval=2,
                     seed=3)
    quiet = lambda line: None  # noqa: E731
    plain = train(mc, tc, tmp_path / "plain", corpus=corpus, progress=quiet)
    _single_process_env(monkeypatch)
    with process_group("cpu") as d:
        ddp = train(mc, tc, tmp_path / "ddp", corpus=corpus, progress=quiet, dist=d)
    assert tc.device == "cpu" and tc.batch_size == 4
    assert _strip(_rows(tmp_path / "ddp")) == _strip(_rows(tmp_path / "plain"))
    wa = load_checkpoint(plain["checkpoint"]).state_dict()
    wb = load_checkpoint(ddp["checkpoint"]).state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert (plain["world_size"], ddp["world_size"]) == (1, 1)


# ---- two gloo processes against one --------------------------------------------------------

def _torchrun(out: Path, *extra: str, nproc: int = 2) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
           f"--master_port={_free_port()}", "-m", "app", "train", "--out", str(out), *TRAIN_ARGS, *extra]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> Path:
    """The reference: ``python -m app train`` in this one process."""
    out = tmp_path_factory.mktemp("single") / "run"
    assert main(["train", "--out", str(out), *TRAIN_ARGS]) == 0
    return out


def _assert_same_curve(a: Path, b: Path, weight_atol: float = 1e-5) -> None:
    ra, rb = _rows(a), _rows(b)
    assert [(r["step"], sorted(r)) for r in ra] == [(r["step"], sorted(r)) for r in rb]
    for x, y in zip(ra, rb):
        assert (x["lr"], x["tokens"]) == (y["lr"], y["tokens"])
        for key in ("train_loss", "val_loss"):
            if key in x:
                assert y[key] == pytest.approx(x[key], rel=1e-4), (x["step"], key)
    wa = load_checkpoint(next((a / "checkpoints").glob("final_*"))).state_dict()
    wb = load_checkpoint(next((b / "checkpoints").glob("final_*"))).state_dict()
    for k in wa:
        assert torch.allclose(wa[k], wb[k], rtol=1e-4, atol=weight_atol), k


def _files(run: Path) -> list[str]:
    return sorted(p.relative_to(run).as_posix() for p in run.rglob("*") if p.is_file())


@pytest.mark.slow
def test_two_gloo_processes_reproduce_one(tmp_path, one_process):
    """torchrun --nproc_per_node=2 with the same arguments: the same loss curve
    (train and val per step, ~1e-4 relative) and final weights; one set of
    files (one events file, each checkpoint once, no temporary or resume
    files); progress and the summary printed by rank 0 only."""
    out = tmp_path / "ddp"
    res = _torchrun(out)
    assert res.returncode == 0, res.stderr[-3000:]
    _assert_same_curve(one_process, out)
    files = _files(out)
    events = [f for f in files if f.startswith("events.out.tfevents.")]
    assert len(events) == 1
    assert [f for f in files if f not in events] == [
        "checkpoints/final_step_000008.safetensors", "checkpoints/step_000004.safetensors",
        "config.json", "metrics.jsonl"]
    assert [f for f in _files(one_process) if not f.startswith("events.")] == \
        [f for f in files if f not in events]
    assert res.stdout.count("final val loss") == 1
    assert res.stderr.count("ddp step 8/8 loss") == 1
    assert res.stderr.count("DistributedDataParallel on 2 processes (gloo), global batch 8 = 2 x 4") == 1
    assert json.loads((out / "config.json").read_text())["batch_size"] == 8


@pytest.mark.slow
def test_resume_under_two_processes_continues_a_one_process_run(tmp_path, one_process):
    """A one-process run stopped after its step-4 resume state, resumed by
    torchrun with two processes (rank 0 writes, both read the state), ends
    on the uninterrupted run's curve."""
    out = tmp_path / "resumed"

    class Stop(Exception):
        pass

    def stop_at_6(line: str) -> None:
        if "step 6/8" in line:
            raise Stop

    mc, tc = configs_from_args(build_parser().parse_args(["train", "--out", str(out), *TRAIN_ARGS]))
    with pytest.raises(Stop):
        train(mc, tc, out, progress=stop_at_6)
    assert (out / RESUME_FILE).exists()
    res = _torchrun(out, "--resume")
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stderr.count("resuming at step 4") == 1
    _assert_same_curve(one_process, out)
    assert not (out / RESUME_FILE).exists()
    assert len(list(out.glob("events.out.tfevents.*"))) == 2  # the first session's and the resumed one's


def test_batch_not_divisible_by_processes_is_refused_before_writing(tmp_path, monkeypatch, capsys):
    """Each torchrun worker (here rank 0 of 2, the environment torchrun gives it) refuses a global
    batch the processes cannot share before it joins the process group: one line, exit 2,
    nothing written."""
    import experiments.distributed

    def no_group(device):
        raise AssertionError("joined the process group before checking the batch")

    _clear_torchrun_env(monkeypatch)
    for var, value in {**FULL_ENV, "RANK": "0", "LOCAL_RANK": "0", "MASTER_PORT": str(_free_port())}.items():
        monkeypatch.setenv(var, value)
    monkeypatch.setattr(experiments.distributed, "process_group", no_group)
    out = tmp_path / "odd"
    assert main(["train", "--out", str(out), *TRAIN_ARGS, "--batch-size", "7"]) == 2
    assert capsys.readouterr().err == ("error: expected --batch-size (the global batch, split over all processes) "
                                       "divisible by the 2 processes, found 7 (remainder 1); use 6 or 8\n")
    assert not out.exists()


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("nproc", [1, 2])
def test_nccl_on_cuda_local_rank_reproduces_one_gpu_process(tmp_path, nproc):
    """--device cuda under torchrun: nccl, rank r on cuda:r, the one-GPU curve."""
    if torch.cuda.device_count() < nproc:
        pytest.skip(f"needs {nproc} GPUs, found {torch.cuda.device_count()}")
    ref = tmp_path / "one"
    assert main(["train", "--out", str(ref), *TRAIN_ARGS, "--device", "cuda"]) == 0
    out = tmp_path / "ddp"
    res = _torchrun(out, "--device", "cuda", nproc=nproc)
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"DistributedDataParallel on {nproc} processes (nccl)" in res.stderr
    assert json.loads((out / "config.json").read_text())["device"] == "cuda:0"
    # GPU reductions differ in order from run to run; Adam turns tiny gradient
    # differences into update differences up to lr, hence the looser weight check
    _assert_same_curve(ref, out, weight_atol=1e-3)


def test_sweep_refuses_to_run_once_per_torchrun_rank(tmp_path, monkeypatch, capsys):
    _clear_torchrun_env(monkeypatch)
    for var, value in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}.items():
        monkeypatch.setenv(var, value)
    assert main(["sweep", "--variants", "qkv", "--weight-decays", "0.1", "--out", str(tmp_path / "sweep")]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: expected `python -m app sweep` outside torchrun, found RANK/WORLD_SIZE set; run it as a "
        "plain process (each of its runs can use --jobs), or train one run with `torchrun ... -m app train`")
    assert not (tmp_path / "sweep").exists()
