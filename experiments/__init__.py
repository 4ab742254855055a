"""qkvscope's own experiments: the variant models and the trainer behind the demo.

* ``model``: one GPT-style model parametrised by attention variant (``qkv``,
  ``wq_identity``, ``q_eq_k``, ``k_eq_v``, ``q_eq_k_eq_v``) and kv-head sharing
  (MHA, GQA, MQA), with a KV cache; loads nanoGPT and query-free checkpoints.
* ``corpus``: byte-level real-text corpora (default: the Python standard library).
* ``train``: AdamW trainer writing run folders (config.json, metrics.jsonl,
  TensorBoard events, safetensors checkpoints), resumable.
* ``sweep``: grids of runs trained in parallel processes.
* ``demo``: what ``python -m app demo --rebuild`` trains into ``data/demo/``.
"""
