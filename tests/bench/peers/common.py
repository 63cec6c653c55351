"""What every peer server shares: the scikit-learn model, trained the same way in each server at start-up.

Imported by the server scripts from their own virtualenvs (tools/install-peers.sh), so it needs numpy and
scikit-learn only. Training from a fixed seed instead of unpickling keeps every server on the same model even where
the virtualenvs hold different scikit-learn versions.
"""

from __future__ import annotations

from typing import Any

FEATURES = 16


def build_model() -> Any:
    """A logistic regression on 16 float features, 2 classes (fit on 2,000 seeded samples in well under a second)."""
    from sklearn.datasets import make_classification
    from sklearn.linear_model import LogisticRegression

    x, y = make_classification(n_samples=2000, n_features=FEATURES, n_informative=8, random_state=0)
    return LogisticRegression(max_iter=500).fit(x.astype("float32"), y)
