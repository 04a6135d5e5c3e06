"""``gqattn.transformers``: gqattn as a Hugging Face transformers attention
implementation, under the library's name.

::

    import gqattn.transformers
    gqattn.transformers.register()   # once, before loading the model
    model = AutoModelForCausalLM.from_pretrained(..., attn_implementation="gqattn")

The same objects as ``gqattn.hf`` (``register``, ``gqattn_attention_forward``);
see that module for what is accepted and what raises. Inside gqattn,
``import transformers`` still finds Hugging Face's package: the imports are
absolute.
"""

from .hf import gqattn_attention_forward, register

__all__ = ["gqattn_attention_forward", "register"]
