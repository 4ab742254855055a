"""qkvscope's own experiments, and any stored checkpoint as a model that runs.

* ``config``: ``GPTConfig``, ``TrainConfig`` and the option lists, torch-free (the CLI's parsers).
* ``model``: one GPT-style model parametrised by attention variant (``analysis.variants``) and
  kv-head sharing (MHA, GQA, MQA), with a KV cache; ``vision``: the same blocks as a ViT, and
  image data (digits, ``.npz``, class folders).
* ``foreign``: other people's checkpoints (nanoGPT, the two papers', llama2.c) run as the GPT,
  built from the canonical layers and body their layout module (``loaders/layouts``) hands over.
* ``runnable``: a stored checkpoint as a model that runs (Hugging Face with
  ``trust_remote_code=False``, own, foreign), its attention modules and the hooked forward;
  ``activation_runs``: the activation metrics on a text or image sample; ``attention_maps``:
  the Inspector's maps on a sample text (``sample_text``: that text and its token cap, torch-free).
* ``corpus``: byte-level real-text corpora (default: the Python standard library).
* ``train``: AdamW trainer writing run folders (config.json, metrics.jsonl, TensorBoard
  events, safetensors checkpoints), resumable, both tasks; ``distributed``: torchrun.
* ``sweep``: grids of runs trained in parallel processes.
* ``demo``: what ``python -m app demo --rebuild`` trains into ``data/demo/``.
"""
