"""Split conformal classification through MAPIE on a fixed probability table: the reference implementation.

Our kernels (:func:`~conformal.kernels.aps_scores`, :func:`~conformal.kernels.threshold`,
:func:`~conformal.kernels.prediction_sets`) are checked against MAPIE's ``SplitConformalClassifier`` in the
tests and timed against it in ``benchmarks/bench_conformal.py``; both use this one adapter. MAPIE and
scikit-learn are optional (``pip install mapie``); without them :class:`MapieSplitAPS` raises
:class:`~snapaudit_jax.utils.errors.DependencyError`.

The classifier is a prefit table lookup: row ``i`` of the table is the predictive distribution of document
``i``. MAPIE's APS score subtracts ``u * p_y`` with ``u ~ U(0, 1)`` and has no switch to turn that off; the
score here is the plain cumulative mass of the truth (Romano et al.'s non-randomised APS, our
``aps_scores``), computed by MAPIE's own ``get_true_label_cumsum_proba``.
"""

from __future__ import annotations

import functools
import warnings
from fractions import Fraction

import numpy as np

from snapaudit_jax.utils.errors import DependencyError, InputError

__all__ = ["MapieSplitAPS", "mapie_version"]


def mapie_version() -> str | None:
    """The installed MAPIE's version, or ``None`` when MAPIE (or scikit-learn) cannot be imported.

    Returns:
      ``mapie.__version__`` or ``None``.
    """
    try:
        import mapie
        from mapie.classification import SplitConformalClassifier  # noqa: F401
    except ImportError:
        return None
    return mapie.__version__


@functools.cache
def _classes():
    """The table classifier and the non-randomised APS score, defined once MAPIE is importable."""
    if mapie_version() is None:
        raise DependencyError("the MAPIE reference needs the optional packages mapie and scikit-learn "
                              "(pip install mapie)")
    from mapie.conformity_scores import APSConformityScore
    from sklearn.base import BaseEstimator, ClassifierMixin

    class TableClassifier(ClassifierMixin, BaseEstimator):
        """A prefit classifier whose ``predict_proba`` looks up row ``X[i, 0]`` of a fixed table."""

        def __init__(self, table=None):
            self.table = table

        def fit(self, X=None, y=None):  # noqa: N803 (scikit-learn's argument names)
            self.classes_ = np.arange(self.table.shape[1])
            return self

        def predict_proba(self, X):  # noqa: N803
            return self.table[np.asarray(X)[:, 0].astype(int)]

        def predict(self, X):  # noqa: N803
            return np.argmax(self.predict_proba(X), axis=1)

    class NonRandomAPS(APSConformityScore):
        """APS without MAPIE's ``u * p_y`` randomisation: the cumulative mass through the true label."""

        def get_conformity_scores(self, y, y_pred, y_enc=None, **kwargs):
            scores, self.cutoff = self.get_true_label_cumsum_proba(y, y_pred, self.classes)
            return scores

    return TableClassifier, NonRandomAPS


class MapieSplitAPS:
    """MAPIE's split conformal classifier on rows ``[0, n_cal)`` (calibration) and ``[n_cal, n)`` (test) of a table.

    Args:
      table: ``(n, m)`` predictive distributions, calibration rows first (converted to float64, as MAPIE works).
      n_cal: number of calibration rows.
      alpha: miscoverage level; MAPIE's confidence level is ``1 - alpha`` evaluated exactly from ``repr(alpha)``.

    Raises:
      DependencyError: MAPIE or scikit-learn is not installed.
      InputError: ``n_cal`` is not in ``[1, n)``.
    """

    def __init__(self, table: np.ndarray, n_cal: int, alpha: float):
        """Builds the prefit table classifier (nothing is conformalized yet).

        Args:
          table: see :class:`MapieSplitAPS`.
          n_cal: see :class:`MapieSplitAPS`.
          alpha: see :class:`MapieSplitAPS`.
        """
        table_cls, self._score_cls = _classes()
        self.table = np.asarray(table, np.float64)
        if not 1 <= n_cal < self.table.shape[0]:
            raise InputError(f"n_cal must be in [1, {self.table.shape[0]}) (rows of the table), got {n_cal}")
        self.n_cal = int(n_cal)
        self.alpha = float(alpha)
        self._x = np.arange(self.table.shape[0])[:, None]
        self._estimator = table_cls(self.table).fit()
        self._clf = None

    def conformalize(self, labels: np.ndarray) -> MapieSplitAPS:
        """Conformalizes a fresh MAPIE classifier on the calibration rows (MAPIE conformalizes a classifier once).

        Args:
          labels: ``(n_cal,)`` true labels of the calibration rows (or ``(n,)``: the first ``n_cal`` are used).

        Returns:
          ``self``.

        Raises:
          ValueError: MAPIE's own refusals (e.g. its sample-size rule: "too low").
        """
        from mapie.classification import SplitConformalClassifier

        clf = SplitConformalClassifier(estimator=self._estimator,
                                       confidence_level=float(1 - Fraction(repr(self.alpha))),
                                       conformity_score=self._score_cls(), prefit=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # classes absent from the calibration set
            clf.conformalize(self._x[:self.n_cal], np.asarray(labels)[:self.n_cal])
        self._clf = clf
        return self

    def _fitted(self):
        if self._clf is None:
            raise RuntimeError("MapieSplitAPS: call conformalize(labels) first")
        return self._clf

    @property
    def scores(self) -> np.ndarray:
        """``(n_cal,)`` float64 calibration scores MAPIE computed."""
        return np.asarray(self._fitted().conformity_scores, np.float64).ravel()

    @property
    def quantile(self) -> float:
        """MAPIE's conformal threshold (it computes it inside ``predict_set``: call that first)."""
        return float(self._fitted()._mapie_classifier.quantiles_[0])

    def predict_sets(self, include_last_label: bool = False) -> np.ndarray:
        """MAPIE's prediction sets of the test rows.

        Args:
          include_last_label: MAPIE's switch; ``False`` gives sets that add the top-1 label where ours are
            empty, ``True`` adds the label that crosses the threshold.

        Returns:
          ``(n - n_cal, m)`` bool membership.
        """
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _, sets = self._fitted().predict_set(self._x[self.n_cal:],
                                                 conformity_score_params={"include_last_label": include_last_label})
        return sets[:, :, 0]
