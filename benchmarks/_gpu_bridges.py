r"""The bridge check of ``gpu_check.py``: Phi-3, GPT-NeoX, Gemma, Gemma 2 and DeiT on the device.

Each network is built from its HuggingFace configuration class with O(1) random weights
(matrices :math:`N(0, 1/\mathrm{fan\_in})`, norm gains :math:`1 + N(0, 0.1^2)`, other vectors
:math:`N(0, 0.1^2)`), converted once by ``ctformer.bridges.from_hf``, and run by ``ct.run`` on
torch tensors and on CuPy arrays of the device (:class:`_gpu_capabilities.Device`; NumPy and
torch CPU in a dry run). The reference is the HuggingFace module on the same device:

* float64: ``float64_reference`` (RoPE angles, RMSNorm and softmax in float64), limit 1e-12;
* float32: the stock module in eager attention (its softmax in float32), limit 1e-5;

relative max error over the real tokens of a right-padded batch. Times: the HuggingFace
forward, ctformer on torch and on CuPy (median of 5 after a warm-up), ctformer on the host
CPU, and the ratios ctformer / HF and GPU / CPU.
"""
from __future__ import annotations

import copy
import math
import traceback

import numpy as np

from _gpu_capabilities import TOLERANCE, Device, median_time, ms, rel

COMMON = dict(vocab_size=32, max_position_embeddings=1024, bos_token_id=0, eos_token_id=0, pad_token_id=0)


def _randomize(torch, model, seed, gain=1.0):
    """O(1) weights in place (the HuggingFace initializers give near-zero ones); Gemma's norms
    store gain - 1, so theirs are centred at ``gain=0``."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=p.dtype)
            if p.ndim >= 2:
                p.copy_(noise / math.sqrt(p[0].numel()))
            elif name.endswith("weight") and "norm" in name.lower():
                p.copy_(gain + 0.1 * noise)
            else:
                p.copy_(0.1 * noise)
    return model


def _configs(dry):
    """HuggingFace class prefix -> configuration, at tiny (dry run) or GPU sizes."""
    d, layers, heads, inner = (16, 2, 4, 24) if dry else (256, 4, 8, 512)
    rope = lambda **extra: {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, **extra}}  # noqa: E731
    base = dict(hidden_size=d, intermediate_size=inner, num_hidden_layers=layers, num_attention_heads=heads)
    return {
        "Phi-3 (partial rotary 0.5)": ("Phi3", dict(base, num_key_value_heads=heads // 2, rms_norm_eps=1e-5,
                                                    **rope(partial_rotary_factor=0.5))),
        "GPT-NeoX (parallel residual)": ("GPTNeoX", dict(base, use_parallel_residual=True, hidden_act="gelu",
                                                         **rope(partial_rotary_factor=0.5))),
        "Gemma": ("Gemma", dict(base, num_key_value_heads=1, head_dim=d // heads + 2, rms_norm_eps=1e-6, **rope())),
        "Gemma 2 (soft-capping 1.0, window)": ("Gemma2", dict(
            base, num_key_value_heads=heads // 2, head_dim=d // heads, query_pre_attn_scalar=d // heads,
            sliding_window=3 if dry else 64, attn_logit_softcapping=1.0, rms_norm_eps=1e-6, **rope())),
        "DeiT": ("DeiT", dict(base, layer_norm_eps=1e-6, image_size=16 if dry else 224, patch_size=4 if dry else 16)),
    }


def _build(t, torch, cls, config, seed):
    """(float64 reference, float32 stock copy, host CPU float64 copy) of one network, and its ctformer model."""
    from ctformer.bridges import float64_reference, from_hf

    cfg = getattr(t, f"{cls}Config")(**config) if cls == "DeiT" else getattr(t, f"{cls}Config")(**COMMON, **config)
    kwargs = dict(add_pooling_layer=False) if cls == "DeiT" else {}
    model = _randomize(torch, getattr(t, f"{cls}Model")(cfg, **kwargs).double().eval(), seed,
                       gain=0.0 if cls.startswith("Gemma") else 1.0)
    ct = from_hf(model)
    stock = copy.deepcopy(model).float().eval()
    stock.set_attn_implementation("eager")  # sdpa ignores Gemma 2's soft-cap; eager is the model's formula
    reference = model if cls == "DeiT" else float64_reference(model)
    return reference, stock, ct


def _inputs(torch, cls, config, dry, seed=0):
    """(states (B, N, d) or pixels, padding mask or None) on the host, float64."""
    rng = np.random.default_rng(seed)
    if cls == "DeiT":
        side = config["image_size"]
        return rng.standard_normal((2 if dry else 8, 3, side, side)), None
    batch, tokens = (2, 10) if dry else (4, 256)
    mask = np.ones((batch, tokens), dtype=bool)
    for b in range(1, batch):  # right padding: the first row full, the others shorter
        mask[b, tokens - min(2 * b, tokens - 1):] = False
    return rng.standard_normal((batch, tokens, config["hidden_size"])), mask


def _hf_forward(torch, module, inputs, mask, deit):
    """(ctformer's input state, last hidden state) of the HuggingFace module."""
    with torch.no_grad():
        if deit:
            out = module(pixel_values=inputs, output_hidden_states=True)
            return out.hidden_states[0], out.last_hidden_state
        return inputs, module(inputs_embeds=inputs, attention_mask=mask.long()).last_hidden_state


def _check_dtype(dev, torch, label, modules, ct, raw, mask, dtype, deit, ref64=None):
    """One dtype of one network: HF, ctformer on torch / CuPy / the host; returns HF's output."""
    tdtype, tdev = getattr(torch, dtype), dev.torch_device
    module = modules[dtype].to(tdev)
    inputs = torch.from_numpy(raw).to(device=tdev, dtype=tdtype)  # states, or DeiT's pixels
    tmask = None if mask is None else torch.from_numpy(mask).to(tdev)
    t_hf, (x, ref) = dev.timed(lambda: _hf_forward(torch, module, inputs, tmask, deit), torch_side=True)
    x_host = x.cpu().numpy()
    sides = {"torch": (x, tmask, True),
             "CuPy": (dev.xp.asarray(x_host), None if mask is None else dev.xp.asarray(mask), False)}
    t_cpu, on_host = dev.timed(lambda: ct.run(x_host, padding_mask=mask))
    errors, times = {}, [f"HF {ms(t_hf)}", f"CPU {ms(t_cpu)}"]
    for side, (xs, keep, torch_side) in sides.items():
        t, out = dev.timed(lambda xs=xs, keep=keep: ct.run(xs, padding_mask=keep), torch_side=torch_side)
        if not dev.is_device_array(out, torch_side) or str(out.dtype).rsplit(".")[-1] != dtype:
            raise TypeError(f"{label}: ct.run on {side} {dtype} returned {type(out).__name__} {out.dtype}")
        errors[f"{side} vs HF"] = rel(out, ref, mask)
        times.append(f"{side} {ms(t)} (/HF {t / t_hf:.2f}, GPU/CPU {t / t_cpu:.2f})")
    errors["CPU vs HF"] = rel(on_host, ref, mask)
    if ref64 is not None:  # for the record: both float32 results against the float64 module
        times.append(f"against HF float64: HF float32 {rel(ref, ref64, mask):.1e}, ctformer float32 "
                     f"{rel(on_host, ref64, mask):.1e}")
    dev.verdict(f"{label} {dtype}", errors, TOLERANCE[dtype], ", ".join(times))
    modules[dtype].to("cpu")
    if not dev.dry:
        torch.cuda.empty_cache()
    return ref


def check_bridges(dev: Device):
    """Every new bridge, float64 and float32, on torch tensors and CuPy arrays of the device."""
    import torch
    import transformers as t

    for seed, (label, (cls, config)) in enumerate(_configs(dev.tiny).items()):
        if dev.out_of_time(label):
            continue
        try:
            reference, stock, ct = _build(t, torch, cls, config, seed)
            raw, mask = _inputs(torch, cls, config, dev.tiny, seed)
            modules = {"float64": reference, "float32": stock}
            ref64 = None
            for dtype in ("float64", "float32"):
                if not dev.out_of_time(f"{label} {dtype}"):
                    ref = _check_dtype(dev, torch, label, modules, ct, raw, mask, dtype, cls == "DeiT", ref64)
                    ref64 = ref if dtype == "float64" else None
        except Exception as exc:  # report, go on with the next network
            dev.record(label, f"{type(exc).__name__}: {exc}".splitlines()[0][:160], "FAIL")
            traceback.print_exc()


# -- the pretrained MiniLM, timed against HuggingFace (gpu_check.py section 5) ---------------------
MODEL_SIZES = ((1, 16), (8, 128), (4, 512))
MODEL_TOLERANCE = {"float32": 1e-5, "float64": 1e-12}


def time_minilm(cupy, record, seconds_left, rel_diff):
    """MiniLM: ctformer on CuPy against the HuggingFace encoder on CUDA, per size and dtype.

    ``record(check, result, status)`` reports; ``seconds_left()`` is the run's remaining budget;
    ``rel_diff(ours, ref, cupy)`` the relative max difference.
    """
    if seconds_left() < 120:
        record("model timing", "not run: time budget", "skipped")
        return
    try:
        import torch
        from ctformer.bridges import from_hf_bert, minilm

        model, _ = minilm.load()
    except Exception as exc:
        record("model timing", f"MiniLM not available: {type(exc).__name__}: {exc}"[:160], "skipped")
        return
    if not torch.cuda.is_available():
        record("model timing", "torch has no CUDA device", "skipped")
        return
    ct = from_hf_bert(model)
    sync = cupy.cuda.get_current_stream().synchronize
    for dtype in ("float32", "float64"):
        encoder = model.encoder.to(device="cuda", dtype=getattr(torch, dtype))
        for batch, tokens in MODEL_SIZES:
            label = f"MiniLM {batch} x {tokens} {dtype}"
            if seconds_left() < 60:
                record(label, "not run: time budget", "skipped")
                continue
            try:
                gen = torch.Generator().manual_seed(0)
                ids = torch.randint(1000, model.config.vocab_size, (batch, tokens), generator=gen)
                with torch.no_grad():
                    x = model.embeddings.to("cpu", torch.float64)(input_ids=ids).numpy().astype(dtype)
                tx = torch.from_numpy(x).cuda()

                def hf():
                    with torch.no_grad():
                        return encoder(tx).last_hidden_state

                t_hf, ref = median_time(hf, torch.cuda.synchronize)
                xd = cupy.asarray(x)
                t_ct, ours = median_time(lambda: ct.run(xd), sync)
                err = rel_diff(ours, ref.cpu().numpy(), cupy)
                ok = err <= MODEL_TOLERANCE[dtype]
                record(label, f"HF {t_hf * 1e3:.2f} ms, ctformer {t_ct * 1e3:.2f} ms, ratio "
                              f"{t_ct / t_hf:.2f}; rel. diff {err:.1e}", "ok" if ok else "FAIL")
            except Exception as exc:
                record(label, f"{type(exc).__name__}: {exc}"[:160], "FAIL")
                traceback.print_exc()
        model.encoder.to(device="cpu", dtype=torch.float64)
        torch.cuda.empty_cache()
