"""A scikit-learn job tracked by the platform (no torch, no checkpoints needed).

Fits a gradient-boosting classifier on the breast-cancer set that scikit-learn ships
(no download), logs its params and cross-validated and held-out metrics to tracking
through :class:`shamal.train.Tracker` when ``MLFLOW_TRACKING_URI`` is set (it is, in a
job), and prints the test accuracy as its last line. A job this short needs no
checkpoint: if it is preempted it simply starts again (SIGTERM ends it with exit 75, so
the scheduler requeues it without spending a retry).

    python train.py --n-estimators 100 --learning-rate 0.1
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from sklearn.datasets import load_breast_cancer
from sklearn.ensemble import GradientBoostingClassifier
from sklearn.metrics import accuracy_score, log_loss
from sklearn.model_selection import cross_val_score, train_test_split

from shamal import train


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n-estimators", type=int, default=100)
    p.add_argument("--learning-rate", type=float, default=0.1)
    p.add_argument("--max-depth", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--experiment", default="examples-sklearn")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)

    x, y = load_breast_cancer(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.25, random_state=args.seed, stratify=y
    )
    model = GradientBoostingClassifier(
        n_estimators=args.n_estimators,
        learning_rate=args.learning_rate,
        max_depth=args.max_depth,
        random_state=args.seed,
    )
    tracker = None
    if os.environ.get("MLFLOW_TRACKING_URI"):
        tracker = train.Tracker(args.experiment, params=vars(args))
    with train.PreemptionGuard() as guard:
        cv = cross_val_score(model, x_train, y_train, cv=3)
        if guard.requested:  # nothing worth saving yet: start again later
            guard.exit()
        model.fit(x_train, y_train)
    metrics = {
        "cv_accuracy": float(cv.mean()),
        "test_accuracy": float(accuracy_score(y_test, model.predict(x_test))),
        "test_log_loss": float(log_loss(y_test, model.predict_proba(x_test))),
    }
    for stage, proba in enumerate(model.staged_predict_proba(x_test), start=1):
        if tracker is not None and stage % 10 == 0:
            tracker.log_metric("staged_test_log_loss", float(log_loss(y_test, proba)), stage)
    if tracker is not None:
        tracker.log_metrics(metrics)
        tracker.close()
    print(f"test_accuracy {metrics['test_accuracy']:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
