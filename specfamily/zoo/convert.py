"""GGUF -> a plain Hugging Face folder: transformers' GGUF loader dequantizes the weights, then the model (float32
safetensors), its tokenizer and its chat template are saved as any other local model."""

from __future__ import annotations

from pathlib import Path

from tqdm import tqdm


def convert_gguf(gguf: str | Path, out: str | Path, progress: bool = True, desc: str = "convert GGUF") -> None:
    """Load the causal LM and tokenizer described by the GGUF file ``gguf`` and save both into the folder ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = Path(gguf)
    with tqdm(total=3, desc=desc, unit="step", disable=not progress) as bar:
        bar.set_postfix_str("dequantize weights")
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32, use_kernels=False
        )
        bar.update()
        bar.set_postfix_str("tokenizer")
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        bar.update()
        bar.set_postfix_str("save")
        model.hf_quantizer = None  # its weights are dequantized: save it as the plain float model it now is
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.is_quantized = False
        model.save_pretrained(str(out))
        tokenizer.save_pretrained(str(out))
        bar.update()
