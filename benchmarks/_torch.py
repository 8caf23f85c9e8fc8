"""The PyTorch side of the DP-SGD benchmarks: transformers models under Opacus (hooks and ghost clipping) and the
non-private torch step, on the device torch sees (``bench_dpsgd.py``: GPT-2, ``bench_finetune.py``: the SmolLM2
shape with PEFT).

Import it before torch loads: it sets ``OMP_WAIT_POLICY`` (PyTorch's OpenMP threads spin at every barrier by
default; with other processes on the cores a spinning thread takes the core from the one doing the work -- a tiny
step ran 75x slower on a loaded 2-core machine). torch, transformers, peft and opacus are imported when called.
"""

from __future__ import annotations

import math
import os
import time
import warnings
from typing import Callable

import numpy as np

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

OPACUS_SETUP = ("PrivacyEngine.make_private(grad_sample_mode='hooks', poisson_sampling=True, loss_reduction='mean'), "
                "our batches fed directly, expected_batch_size = q N, position_ids passed per record")
OPACUS_GHOST_SETUP = ("the same with grad_sample_mode='ghost' and the returned criterion wrapping "
                      "CrossEntropyLoss(ignore_index=-100), called with shape=(B, T, V): each sequence's mean loss "
                      "over its real targets, two backward passes per step")


def torch_available() -> str | None:
    """``None`` if torch, transformers, peft and opacus import; else why not."""
    try:
        import opacus  # noqa: F401
        import peft  # noqa: F401
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        return f"{exc.name or exc}: not installed (pip install 'snapaudit-jax[bench]')"
    return None


def configure(threads: int) -> int:
    """Sets torch's intra-op threads (the cores XLA's CPU client uses) and silences Opacus's warnings about full
    backward hooks; returns torch's thread count."""
    import torch

    torch.set_num_threads(threads)
    warnings.filterwarnings("ignore", message=".*[Ff]ull backward hook.*")
    warnings.filterwarnings("ignore", module="opacus")
    return torch.get_num_threads()


def check_errors(check: dict, ghost_unsupported: str | None) -> dict[str, float]:
    """The relative errors of :meth:`Torch.check` by name (``torch_opacus``, and the ghost ones where Opacus ran
    ghost clipping)."""
    errors = {"torch_opacus": check["rel_error"]}
    if ghost_unsupported is None:
        errors["torch_opacus_ghost"] = check["ghost_rel_error"]
        errors["torch_opacus_ghost_norms"] = check["ghost_norms_rel_error"]
    return errors


def versions() -> dict[str, str]:
    """The versions of torch, transformers, peft and opacus (all importable: :func:`torch_available`)."""
    import opacus
    import peft
    import torch
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__,
            "opacus": opacus.__version__}


def _labels(tokens, mask):
    """Next-token targets of each position, ``-100`` (ignored) where the target or its input is padding."""
    import torch

    valid = mask[:, 1:] & mask[:, :-1]
    labels = torch.full_like(tokens, -100)  # transformers' causal-LM loss: shifted labels, no copy of the logits
    labels[:, :-1] = torch.where(valid, tokens[:, 1:], -100)
    return labels


def _logits(module, tokens, mask):
    """The module's logits, with the positions passed per record: transformers makes them one ``(1, T)`` row
    shared by the batch, and Opacus's per-sample gradient of a position embedding (GPT-2's ``wpe``) then has one
    sample instead of one per record."""
    positions = module_positions(tokens)
    return module(input_ids=tokens, attention_mask=mask.long(), position_ids=positions, use_cache=False).logits


def module_positions(tokens):
    """``(B, T)`` position ids ``0 .. T - 1`` of every record (right padding)."""
    import torch

    return torch.arange(tokens.shape[1], device=tokens.device).expand(tokens.shape[0], -1)


def _torch_losses(module, tokens, mask):
    """``(n,)`` per-record mean next-token cross-entropy over real targets (as ``sequence_losses``)."""
    import torch

    logits = _logits(module, tokens, mask)
    labels = _labels(tokens, mask)
    nll = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                            reduction="none", ignore_index=-100)
    return nll.reshape(tokens.shape).sum(1) / (labels != -100).sum(1).clamp(min=1).float()


def torch_device():
    """The device of the torch side: the first CUDA device where torch sees one, else the CPU."""
    import torch

    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


class Torch:
    """The torch steps of one model: Opacus per-sample gradients (hooks), Opacus ghost clipping, non-private.

    Everything (weights, adapters, batches, optimizer state) lives on :func:`torch_device`; each step waits for
    the device before it returns, so that its time is the step's.
    """

    def __init__(self, factory: Callable, data, *, q: float, batches, clip: float, noise_multiplier: float,
                 learning_rate: float, b1: float, loader_batch: int):
        """
        Args:
          factory: ``factory()``: a fresh CPU ``torch.nn.Module`` (a transformers causal LM, PEFT-wrapped or not)
            holding the JAX model's weights; called once per variant.
          data: ``(tokens, mask)`` NumPy arrays ``(N, T)``.
          q: the Poisson sampling rate (the steps divide by ``q N``, as ours).
          batches: the record indices of steps ``0 ..`` (``bench_dpsgd.step_batches``).
          clip: the clip norm ``C``.
          noise_multiplier, learning_rate, b1: as ours (AdamW's other settings: ``DPSGDConfig``'s defaults).
          loader_batch: the batch size of the data loader Opacus is given (only its length is used).
        """
        import torch
        from opacus import PrivacyEngine

        from snapaudit_jax.dpsgd import DPSGDConfig

        self.torch = torch
        self.device = torch_device()
        tokens_np, mask_np = data
        self.tokens = torch.from_numpy(tokens_np.astype(np.int64)).to(self.device)
        self.mask = torch.from_numpy(np.asarray(mask_np, bool)).to(self.device)
        self.batches = batches
        self.clip = clip
        self.normaliser = q * tokens_np.shape[0]
        defaults = DPSGDConfig(steps=1, learning_rate=learning_rate, non_private=True, batch_size=1)

        def adamw(module):
            params = [p for p in module.parameters() if p.requires_grad]
            return torch.optim.AdamW(params, lr=learning_rate, betas=(b1, defaults.b2), eps=defaults.eps,
                                     weight_decay=defaults.weight_decay)

        def fresh():
            return factory().to(self.device).train()

        def private(module, mode: str, **kwargs):
            loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.arange(tokens_np.shape[0])),
                                                 batch_size=loader_batch)
            made = PrivacyEngine(accountant="rdp").make_private(
                module=module, optimizer=adamw(module), data_loader=loader, noise_multiplier=noise_multiplier,
                max_grad_norm=clip, poisson_sampling=True, grad_sample_mode=mode, loss_reduction="mean", **kwargs)
            # Opacus derives the expected batch from the loader (N / ceil(N / B)); ours divides by q N exactly.
            made[1].expected_batch_size = self.normaliser
            return made

        self.plain = fresh()
        self.plain_opt = adamw(self.plain)
        dp_module = fresh()
        self.frozen = {n: p.detach().clone() for n, p in dp_module.named_parameters() if not p.requires_grad}
        self.trainable_before = {n: p.detach().clone() for n, p in dp_module.named_parameters() if p.requires_grad}
        self.dp, self.dp_opt, _ = private(dp_module, "hooks")
        # Ghost clipping (Li et al.): per-sample norms from the hooks' activations and backprops, then a second
        # backward pass of the clip-weighted per-sample losses. Opacus's criterion wrapper reduces each
        # sequence's token losses to their mean over non-ignored targets: the per-record loss of ours.
        self.ghost, self.ghost_opt, self.ghost_criterion, _ = private(
            fresh(), "ghost", criterion=torch.nn.CrossEntropyLoss(ignore_index=-100))
        self.ghost_unsupported = None  # why Opacus's ghost clipping cannot run this model, once check() tried it
        self.trainable_tensors = len(self.trainable_before)
        self.trainable_parameters = sum(p.numel() for p in self.trainable_before.values())

    def _rows(self, t: int):
        idx = self.torch.from_numpy(self.batches[t].astype(np.int64)).to(self.device)
        if idx.numel() == 0:
            raise RuntimeError(f"step {t}: empty Poisson batch (torch cannot step on it); use another --seed")
        return self.tokens[idx], self.mask[idx]

    def _sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def _ghost_loss(self, tokens, mask):
        logits = _logits(self.ghost, tokens, mask)
        return self.ghost_criterion(logits.float().reshape(-1, logits.shape[-1]), _labels(tokens, mask).reshape(-1),
                                    shape=logits.shape)

    def check(self, perturb: bool = False) -> dict:
        """Opacus's per-sample gradients (hooks) against autograd's batched gradient of the same backward pass,
        and ghost clipping's per-sample norms and clipped sum against those per-sample gradients, on batch 0.

        Ghost clipping is dropped (``ghost_unsupported`` says why) where Opacus refuses the model: it does not
        support a parameter used by two modules (the tied embedding and LM head of full fine-tuning).
        """
        torch = self.torch
        tokens, mask = self._rows(0)
        n = tokens.shape[0]
        self.dp_opt.zero_grad(set_to_none=True)
        losses = _torch_losses(self.dp, tokens, mask)
        losses.mean().backward()
        err = ref = 0.0
        sq_norms = torch.zeros(n, dtype=torch.float64, device=self.device)
        samples = {}
        for name, p in self.dp.named_parameters():
            if not p.requires_grad:
                continue
            gs = samples[name.removeprefix("_module.")] = p.grad_sample.double()
            total = gs.sum(0) * (1.0 + 1e-3 if perturb else 1.0)
            err += float(((total - n * p.grad.double()) ** 2).sum())
            ref += float(((n * p.grad.double()) ** 2).sum())
            sq_norms += (gs.reshape(n, -1) ** 2).sum(1)
        self.dp_opt.zero_grad(set_to_none=True)
        norms = sq_norms.sqrt()
        out = {"rel_error": math.sqrt(err / ref), "losses": losses.detach().double().cpu().numpy(),
               "norm_mean": float(norms.mean()), "norms": norms.cpu().numpy()}
        self.ghost_opt.zero_grad(set_to_none=True)
        try:
            self._ghost_loss(tokens, mask).backward()
        except NotImplementedError as exc:  # Opacus: "Parameter tying is not supported with Ghost Clipping"
            self.ghost_unsupported = f"Opacus: {exc}"
            self.ghost = self.ghost_opt = self.ghost_criterion = None
            return out
        factors = torch.clamp(self.clip / (norms + 1e-6), max=1.0)  # Opacus's clipping factor
        err = ref = 0.0
        for name, p in self.ghost.named_parameters():
            if p.requires_grad:
                want = torch.einsum("i,i...->...", factors, samples[name.removeprefix("_module.")])
                got = p.grad.double() * (1.0 + 1e-3 if perturb else 1.0)
                err += float(((got - want) ** 2).sum())
                ref += float((want ** 2).sum())
        ghost_norms = self.ghost.per_sample_gradient_norms.double()
        out["ghost_rel_error"] = math.sqrt(err / ref)
        out["ghost_norms_rel_error"] = float(torch.linalg.norm(ghost_norms - norms) / torch.linalg.norm(norms))
        self.ghost_opt.zero_grad(set_to_none=True)
        return out

    def kinds(self) -> tuple[str, ...]:
        return ("dp", "nonprivate") if self.ghost is None else ("dp", "ghost", "nonprivate")

    def start(self) -> dict:
        """One warm-up step of each; checks that each DP step moved every trainable tensor and no frozen one."""
        seconds = {}
        for name in self.kinds():
            start = time.perf_counter()
            self.step(name, 0)
            seconds[name + "_warmup"] = round(time.perf_counter() - start, 2)
        self.moved_ok = True
        for kind, module in (("dp", self.dp), ("ghost", self.ghost)):
            if module is None:
                continue
            params = dict(module._module.named_parameters()) if hasattr(module, "_module") else dict(
                module.named_parameters())
            moved = sum(not torch_equal(params[n], v) for n, v in self.trainable_before.items())
            frozen_moved = sum(not torch_equal(params[n], v) for n, v in self.frozen.items())
            seconds[f"{kind}_trainable_tensors_moved"] = f"{moved}/{len(self.trainable_before)}"
            seconds[f"{kind}_frozen_tensors_moved"] = frozen_moved
            self.moved_ok &= moved == len(self.trainable_before) and frozen_moved == 0
        return seconds

    def step(self, name: str, t: int) -> None:
        tokens, mask = self._rows(t)
        if name == "dp":
            self.dp_opt.zero_grad(set_to_none=True)
            _torch_losses(self.dp, tokens, mask).mean().backward()  # Opacus: loss_reduction="mean"
            self.dp_opt.step()
        elif name == "ghost":
            self.ghost_opt.zero_grad(set_to_none=True)
            self._ghost_loss(tokens, mask).backward()  # both backward passes
            self.ghost_opt.step()
        else:
            self.plain_opt.zero_grad(set_to_none=True)
            (_torch_losses(self.plain, tokens, mask).sum() / self.normaliser).backward()
            self.plain_opt.step()
        self._sync()


def torch_equal(a, b) -> bool:
    return bool((a.detach() == b).all())
