"""Worker of benchmarks/vs_breaching.py: runs breaching's attacks on privaudit's observations.

Run with the interpreter of ``benchmarks/.breaching-env`` (made by setup_breaching.sh), never
with the system python: breaching lives only in that venv. Usage::

    _breaching_worker.py OBSERVATIONS.safetensors OUTPUT.safetensors

The input (written by vs_breaching.py or strength.py) holds, for observation ``k``:
``{k}.param.{name}`` (the model's parameters), ``{k}.grad.{name}`` (the true gradient),
``{k}.x0`` (the initial batch in [0, 1], (B, C, H, W): B is the batch size breaching is told)
and ``{k}.y0`` (DLG's initial label logits); its metadata ``config`` is JSON with the
hyperparameters and breaching config overrides, and optionally ``per_observation``:
``{"k": {"model", "mean", "std"}}`` (default: the LeNet with ``config``'s mean/std).

The worker imports everything, then reads one JSON command per line on stdin, so that the main
script can interleave its own runs with breaching's (fair timing on a shared machine):

- ``{"attack": "ig", "k": 0, "iterations": N, "keep": true, "overrides": [...]}``: one
  breaching reconstruction (``overrides``, optional: further config overrides for this run;
  ``"known_labels": true`` hands breaching the true labels ``{k}.label`` in the user's
  metadata, which it then uses instead of inferring them);
  replies one JSON line ``{"wall", "cpu", "evals", "steps", "objective"}`` on stdout (breaching's
  own prints go to stderr). ``wall``/``cpu`` cover ``attacker.reconstruct()`` only: no import,
  config or attacker construction. ``evals`` counts forward passes, ``steps`` optimizer steps.
  ``keep`` stores the reconstruction ([0, 1] image) and labels for the output file.
- ``{"finish": true}``: writes OUTPUT (``{attack}.{k}.recon``, ``{attack}.{k}.label``, metadata
  ``results`` = JSON of every run's times and counts and the breaching configs) and exits.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import warnings

warnings.filterwarnings("ignore")  # torch.jit.script deprecation (breaching scripts its losses)


def main(argv: list[str]) -> int:
    src, dst = argv
    # Protocol on the real stdout; everything printed by breaching / hydra goes to stderr.
    reply = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    from safetensors.torch import load_file, safe_open, save_file

    with safe_open(src, "pt") as f:
        cfg = json.loads(f.metadata()["config"])
    import torch

    torch.set_num_threads(int(cfg["threads"]))
    import breaching
    from omegaconf import OmegaConf
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from privaudit.scenario.models import build_model

    logging.getLogger("breaching").setLevel(logging.WARNING)
    tensors = load_file(src)
    device = torch.device(cfg["device"])
    setup = dict(dtype=torch.float, device=device)
    shape = list(cfg["input_shape"])
    pixel_space = cfg["breaching_space"] == "pixel"
    per_observation = cfg.get("per_observation", {})  # benchmarks/strength.py sets it

    def spec(k: int) -> tuple[str, torch.Tensor, torch.Tensor]:
        """Observation k's model name and normalisation (default: the LeNet, cfg's)."""
        s = per_observation.get(str(k), {})
        mean = torch.tensor(s.get("mean", cfg["mean"])).reshape(1, -1, 1, 1)
        std = torch.tensor(s.get("std", cfg["std"])).reshape(1, -1, 1, 1)
        return s.get("model", "lenet"), mean, std

    class Normalized(torch.nn.Module):
        """``net((x − mean) / std)``: breaching then optimises [0, 1] pixels, as privaudit."""

        def __init__(self, net: torch.nn.Module, mean: torch.Tensor, std: torch.Tensor):
            super().__init__()
            self.net = net
            self.register_buffer("mean", mean.clone())
            self.register_buffer("std", std.clone())

        def forward(self, x):
            return self.net((x - self.mean) / self.std)

    counts = {"evals": 0, "steps": 0}

    def count_eval(*_):
        counts["evals"] += 1

    def count_step(*_):
        counts["steps"] += 1

    register_optimizer_step_post_hook(count_step)

    def build(k: int):
        name, mean, std = spec(k)
        net = build_model(name, tuple(shape), int(cfg["num_classes"]), 0)
        params = {n: tensors[f"{k}.param.{n}"] for n, _ in net.named_parameters()}
        net.load_state_dict(params, strict=True)
        net.register_forward_hook(count_eval)  # one call per forward pass (copies share it)
        model = Normalized(net, mean, std) if pixel_space else net
        grads = [tensors[f"{k}.grad.{n}"].to(device) for n, _ in net.named_parameters()]
        return model.to(device), grads

    def payloads(model, grads, k: int, labels=None):
        meta = dict(
            shape=shape, modality="vision", task="classification", classes=int(cfg["num_classes"])
        )
        if pixel_space:
            meta.update(mean=[0.0] * shape[0], std=[1.0] * shape[0])
        else:
            _, mean, std = spec(k)
            meta.update(mean=mean.flatten().tolist(), std=std.flatten().tolist())
        points = int(tensors[f"{k}.x0"].shape[0])  # the batch size B
        server = dict(
            parameters=[p.detach().clone() for p in model.parameters()],
            buffers=[b.detach().clone() for b in model.buffers()] or None,
            metadata=OmegaConf.create(meta),
        )
        user = dict(
            gradients=[g.clone() for g in grads],
            buffers=None,
            metadata=dict(num_data_points=points, labels=labels, local_hyperparams=None),
        )
        return [server], [user]

    def to_model_space(x, k: int):
        _, mean, std = spec(k)
        return x if pixel_space else (x - mean.to(x)) / std.to(x)

    def to_pixels(x, k: int):
        _, mean, std = spec(k)
        x = x if pixel_space else x * std.to(x) + mean.to(x)
        return x.clamp(0, 1)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    configs = {}

    def run(attack: str, k: int, iterations: int, extra: list[str], known_labels: bool):
        a = cfg[attack]
        overrides = [f"optim.max_iterations={iterations}"] + list(a["overrides"]) + extra
        cfg_attack = breaching.get_attack_config(a["config"], overrides=overrides)
        configs[attack] = OmegaConf.to_container(cfg_attack, resolve=True)
        model, grads = build(k)
        loss_fn = torch.nn.CrossEntropyLoss()
        attacker = breaching.attacks.prepare_attack(model, loss_fn, cfg_attack, setup)
        x0 = to_model_space(tensors[f"{k}.x0"].to(device), k)
        if attack == "dlg":
            # Same initial label logits as privaudit: breaching draws them with randn inside
            # _initialize_data; overwrite that (B, classes) draw with privaudit's start point.
            y0 = tensors[f"{k}.y0"].to(device)
            original = attacker._initialize_data

            def init(data_shape, _orig=original, _y0=y0):
                c = _orig(data_shape)
                if tuple(data_shape) == tuple(_y0.shape):
                    c.data.copy_(_y0)
                return c

            attacker._initialize_data = init
        labels = tensors[f"{k}.label"].to(device) if known_labels else None
        server, user = payloads(model, grads, k, labels)
        counts.update(evals=0, steps=0)
        sync()
        c, t = time.process_time(), time.perf_counter()
        out, stats = attacker.reconstruct(server, user, {}, x0, dryrun=False)
        sync()
        wall, cpu = time.perf_counter() - t, time.process_time() - c
        info = dict(
            wall=wall,
            cpu=cpu,
            evals=counts["evals"],
            steps=counts["steps"],
            objective=float(stats["opt_value"]) if "opt_value" in stats else None,
        )
        return info, out

    runs: list[dict] = []
    kept = {}
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd.get("finish"):
            break
        extra = list(cmd.get("overrides", []))
        known = bool(cmd.get("known_labels", False))
        info, out = run(cmd["attack"], int(cmd["k"]), int(cmd["iterations"]), extra, known)
        runs.append(dict(cmd, **info))
        if cmd.get("keep"):
            key = f"{cmd['attack']}.{cmd['k']}"
            kept[f"{key}.recon"] = to_pixels(out["data"].detach(), int(cmd["k"])).cpu().contiguous()
            kept[f"{key}.label"] = torch.as_tensor(out["labels"]).reshape(-1).long().cpu()
        reply.write(json.dumps(info) + "\n")
    results = dict(
        runs=runs, configs=configs, torch_threads=torch.get_num_threads(), torch=torch.__version__
    )
    save_file(kept, dst, metadata={"results": json.dumps(results)})
    reply.write(json.dumps({"finished": True}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
