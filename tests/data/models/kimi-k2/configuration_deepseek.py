"""Stand-in for the `configuration_deepseek.py` of the deepseek-ai/DeepSeek-V3 checkpoint, the module its
config.json's `auto_map` names for `AutoConfig`. SGLang is launched with `--trust-remote-code`, so transformers
loads the config class from the model directory; this file gives it transformers' own DeepseekV3Config
(model_type deepseek_v3), which reads the same config.json keys. DeepSeek's file is not copied here."""

from transformers.models.deepseek_v3.configuration_deepseek_v3 import DeepseekV3Config as _DeepseekV3Config


class DeepseekV3Config(_DeepseekV3Config):
    """transformers' DeepseekV3Config under the name the checkpoint's auto_map gives."""
