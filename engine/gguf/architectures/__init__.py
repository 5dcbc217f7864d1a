"""Every ``general.architecture`` mlxcel reads, each mapped onto an mlx-lm model class."""

from __future__ import annotations

from mlxcel.engine.gguf.architectures.base import Architecture, Conversion, TensorIndex
from mlxcel.engine.gguf.architectures.deepseek2 import Deepseek2
from mlxcel.engine.gguf.architectures.gemma import Gemma, Gemma2, Gemma3, Gemma3n
from mlxcel.engine.gguf.architectures.gpt_oss import GptOss
from mlxcel.engine.gguf.architectures.granite import Granite, GraniteMoe
from mlxcel.engine.gguf.architectures.lfm2 import Lfm2
from mlxcel.engine.gguf.architectures.llama import Llama, SeedOss, SmolLM3
from mlxcel.engine.gguf.architectures.olmo import Olmo2, Olmoe
from mlxcel.engine.gguf.architectures.phi3 import Phi3
from mlxcel.engine.gguf.architectures.qwen import Qwen2, Qwen2Moe, Qwen3, Qwen3Moe
from mlxcel.engine.gguf.architectures.qwen2vl import Qwen2VL
from mlxcel.engine.gguf.architectures.qwen_hybrid import Qwen3Next, Qwen35, Qwen35Moe
from mlxcel.engine.gguf.architectures.small_families import Ernie45, Exaone4
from mlxcel.engine.gguf.architectures.starcoder2 import Starcoder2

ARCHITECTURES: dict[str, Architecture] = {
    arch.name: arch
    for arch in (
        Llama(), Qwen2(), Qwen3(), Qwen2Moe(), Qwen3Moe(),
        Gemma(), Gemma2(), Gemma3(), Gemma3n(), Phi3(), Olmo2(), Granite(), GraniteMoe(), Starcoder2(),
        GptOss(), Deepseek2(), Lfm2(), Qwen3Next(), Qwen35(), Qwen35Moe(),
        SmolLM3(), SeedOss(), Olmoe(), Ernie45(), Exaone4(), Qwen2VL(),
    )
}

__all__ = ["ARCHITECTURES", "Architecture", "Conversion", "TensorIndex"]
