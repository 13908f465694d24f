"""benchmarks/bench_real_models.py (issue 46) measures what it says: its resnet18 is torchvision's (the modules,
parameter count and state names of torchvision.models.resnet18(num_classes=10)), and a side run through the
embedded default (a real server and worker processes) trains the ravdl CNN to eager PyTorch's losses bit for bit,
with every process of the engine's tree found and its memory sampled."""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_real_models  # noqa: E402
import real_models  # noqa: E402


def test_resnet18_is_torchvisions():
    model = real_models.ResNet((2, 2, 2, 2), num_classes=10)
    state = model.state_dict()
    assert sum(p.numel() for p in model.parameters()) == 11_181_642
    assert len(state) == 122   # 62 parameters, 20 BatchNorms' 3 buffers each
    assert list(state)[:3] == ["conv1.weight", "bn1.weight", "bn1.bias"]
    assert "layer2.0.downsample.0.weight" in state and "layer1.0.downsample.0.weight" not in state
    assert tuple(state["conv1.weight"].shape) == (64, 3, 7, 7) and tuple(state["fc.weight"].shape) == (10, 512)


def test_engine_side_matches_eager_and_finds_its_processes():
    # the embedded default's 2 workers, and eager with the threads each gets (bits depend on the thread count)
    args = argparse.Namespace(steps=3, workers=2, threads=bench_real_models.per_worker(2))
    engine = bench_real_models.run_side("engine", "cnn", args)
    eager = bench_real_models.run_side("eager", "cnn", args)
    assert len(engine["losses"]) == len(eager["losses"]) == 3
    assert bench_real_models.loss_gap(engine["losses"], eager["losses"]) == 0.0
    assert {"requester", "server", "workers"} <= set(engine["roles"])
    assert set(eager["roles"]) == {"requester"} and eager["processes"] == 1
    # the roles' peaks may fall at different moments: the tree's peak lies between the largest and their sum
    assert max(engine["roles"].values()) <= engine["pss_mib"] <= sum(engine["roles"].values()) + 1
    assert engine["vmhwm_mib"] > engine["roles"]["requester"]
    # CPU seconds beside the seconds, for the run and for a steady step, on both sides
    assert engine["cpu"] > 0 and eager["cpu"] > 0 and engine["steady_cpu"] > 0 and eager["steady_cpu"] > 0
