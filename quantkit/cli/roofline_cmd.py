"""`quantkit roofline`: what-if predictions from datasheet or probed device figures."""

from __future__ import annotations

import click

from quantkit.cli._common import echo_json, int_list, json_option


def predict(
    cfg: dict,
    device,
    bits_list,
    group_size: int,
    prompt_len: int,
    context: int,
    quantize_lm_head: bool,
    kv_value_bytes: float = 2.0,
) -> list[dict]:
    from dataclasses import replace

    from quantkit.core.roofline import (
        Shape,
        decode_bytes,
        kv_bytes_per_token,
        predict_ttft_s,
        prefill_bytes,
        prefill_flops,
        quantized_layout,
    )

    shape = Shape.from_config(cfg)
    rows = []
    for bits in bits_list:
        layout = replace(quantized_layout(bits, group_size, True, quantize_lm_head), kv_bytes=kv_value_bytes)
        b = decode_bytes(shape, layout, context)
        tpot = b / device.bandwidth
        ttft = predict_ttft_s(
            prefill_flops(shape, prompt_len), device.compute, prefill_bytes(shape, layout, prompt_len), device.bandwidth
        )
        rows.append(
            {
                "bits": bits,
                "bytes_per_token": b,
                "kv_bytes_per_token": kv_bytes_per_token(shape, layout),
                "predicted_tpot_ms": tpot * 1e3,
                "tokens_per_s": 1.0 / tpot,
                "predicted_ttft_ms": ttft * 1e3,
            }
        )
    return rows


@click.command("roofline")
@click.option(
    "--shape",
    "shape_name",
    required=True,
    help="A named shape (llama3-8b, mistral-7b, ...) or a config.json / model directory.",
)
@click.option(
    "--device",
    "device_name",
    default=None,
    help="A datasheet device (h200, h100, a100, l40s, rtx4090, ...); default: this machine's probe.",
)
@click.option("--bits", default="16,8,4", show_default=True, help="Weight bit widths to compare.")
@click.option("--group-size", default=128, show_default=True, type=int)
@click.option("--prompt-len", default=256, show_default=True, type=int)
@click.option("--context", default=None, type=int, help="Context length for the KV read (default: prompt length).")
@click.option("--quantize-lm-head", is_flag=True, help="Count the lm_head at the same bits (default: kept in 16 bits).")
@click.option(
    "--kv-cache",
    default="f16",
    show_default=True,
    help="The KV cache's type: f16, fp8 (an FP8 kv_cache_scheme), or llama.cpp's (q8_0, q4_0, ...; K/V: q8_0/f16).",
)
@json_option
def roofline_cmd(shape_name, device_name, bits, group_size, prompt_len, context, quantize_lm_head, kv_cache, as_json):
    """Predicted batch-1 TPOT and TTFT floors for a model shape on a device."""
    from quantkit.core.hardware import get_device, shape_config
    from quantkit.core.kv_cache import value_bytes
    from quantkit.errors import QuantkitError

    kv_value_bytes = value_bytes(kv_cache)  # an unknown type: one line, before any probe
    bits_list = int_list(bits, "--bits")
    if any(b not in (2, 3, 4, 8, 16) for b in bits_list):
        raise QuantkitError("--bits: each width must be one of 2, 3, 4, 8, 16")
    if prompt_len <= 0 or (context is not None and context < 0):
        raise QuantkitError("--prompt-len must be positive and --context non-negative")
    if group_size == 0 or group_size < -1:
        raise QuantkitError(
            f"--group-size {group_size}: -1 (one scale per output channel) or a positive number of weights per scale"
        )
    if device_name:
        device = get_device(device_name)
    else:
        from quantkit.bench.probe import cached_probe
        from quantkit.device import resolve_device

        device = cached_probe(resolve_device("auto"))  # this machine's default device, probed
    cfg = shape_config(shape_name)
    rows = predict(
        cfg,
        device,
        bits_list,
        group_size,
        prompt_len,
        prompt_len if context is None else context,
        quantize_lm_head,
        kv_value_bytes,
    )
    out = {
        "shape": shape_name,
        "device": device.name,
        "bandwidth_gbps": device.bandwidth / 1e9,
        "compute_tflops": device.compute / 1e12,
        "device_source": device.source,
        "group_size": group_size,
        "prompt_len": prompt_len,
        "kv_cache": kv_cache,
        "rows": rows,
    }
    if as_json:
        echo_json(out)
        return
    click.echo(
        f"{shape_name} on {device.name} ({device.bandwidth / 1e9:.0f} GB/s, {device.compute / 1e12:.1f} TFLOP/s)"
    )
    click.echo(f"{'bits':>4}  {'GB/token':>9}  {'KV kB/tok':>9}  {'TPOT ms':>8}  {'tok/s':>8}  {'TTFT ms':>8}")
    for r in rows:
        click.echo(
            f"{r['bits']:>4}  {r['bytes_per_token'] / 1e9:>9.3f}  {r['kv_bytes_per_token'] / 1e3:>9.1f}  "
            f"{r['predicted_tpot_ms']:>8.3f}  {r['tokens_per_s']:>8.1f}  {r['predicted_ttft_ms']:>8.2f}"
        )


COMMANDS = [roofline_cmd]
