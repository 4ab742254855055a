"""Pure computation: canonical tensors and DataFrames in, tidy DataFrames out.

One module per metric family, each with its formulas and sources:
``kv_similarity`` (flat cosine, linear CKA, K=V sharing fit), ``qk_geometry``
(symmetry, directionality), ``spectra`` (effective/stable/energy ranks),
``query_absorb`` (stacked W_Q condition, orthogonality defect, absorb error);
``weights`` and ``activations`` run them over one layer; ``registry`` names
every metric (level, axis, direction, chance rule) and ``plugins`` runs the
metrics registered from outside (``QKVSCOPE_PLUGINS``); ``chance`` gives each
value its chance level; ``captures`` (attention logits and maps of captured
tensors), ``notes`` and ``result_rows`` serve the jobs; ``trajectories``,
``wd_sensitivity`` and ``wd_regression`` work across checkpoints and runs;
``kv_cost``, ``kv_geometry``, ``gpus`` and ``presets`` the serving calculator;
``results_table`` and ``paper_claims`` the Results and Papers pages. Two
standard-library leaves every package may import: ``variants`` and
``directions``. Imports: torch, numpy, pandas, scikit-learn only.
"""
