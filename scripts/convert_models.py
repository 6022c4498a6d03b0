#!/usr/bin/env python3
"""Saves each GGUF model of a folder as transformers loads it (bfloat16 weights, save_pretrained), one folder per
file, so that later loads take seconds instead of dequantizing the GGUF again: the Python tests (GAAC_HF_MODELS)
and the GPU benchmark (--hf-models) read these. Models already converted are kept.

  python3 scripts/convert_models.py MODELS_DIR OUT_DIR
"""
import pathlib
import sys
import time


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    import torch
    from transformers import AutoModelForCausalLM

    models, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    files = sorted(models.glob("*.gguf"))
    if not files:
        sys.exit(f"no GGUF file in {models}")
    for gguf in files:
        target = out / gguf.name
        if (target / "config.json").is_file():
            continue
        t0 = time.time()
        model = AutoModelForCausalLM.from_pretrained(models, gguf_file=gguf.name, dtype=torch.bfloat16)
        model.config.quantization_config = None  # the weights are plain bfloat16 once loaded
        model.hf_quantizer = None
        partial = target.with_name(target.name + ".partial")  # a run cut short leaves no folder that looks done
        model.save_pretrained(partial)
        partial.rename(target)
        print(f"{gguf.name}: converted in {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
