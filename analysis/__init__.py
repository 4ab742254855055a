"""Pure computation: canonical tensors and DataFrames in, tidy DataFrames out.

One module per metric family, each with its formulas and sources:
``kv_similarity`` (flat cosine, linear CKA, K=V sharing fit), ``qk_geometry``
(symmetry, directionality), ``spectra`` (effective/stable/energy ranks),
``query_absorb`` (stacked W_Q condition, orthogonality defect, absorb error);
``weights`` and ``activations`` run them over one layer; ``registry`` names
every metric; ``trajectories`` and ``wd_sensitivity`` work across checkpoints
and runs. Imports: torch, numpy, pandas, scikit-learn only.
"""
