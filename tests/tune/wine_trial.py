"""A trial job for `shamal tune`: a scikit-learn decision tree on the wine data set.

Run as a trial (``shamal tune --study wine --direction maximize -- python wine_trial.py``),
it takes max_depth and criterion from the study, reports the cross-validation accuracy
fold by fold (so a pruner can stop a hopeless trial), logs everything to a tracked run
tagged with its trial, logs the fitted model and tells the mean accuracy.
"""

from __future__ import annotations

import mlflow
import mlflow.sklearn
from sklearn.datasets import load_wine
from sklearn.model_selection import StratifiedKFold
from sklearn.tree import DecisionTreeClassifier

import shamal.tune


def main() -> None:
    trial = shamal.tune.current_trial()
    if trial is None:
        raise SystemExit("run me as a trial: shamal tune ... -- python wine_trial.py")
    depth = trial.suggest_int("max_depth", 1, 6)
    criterion = trial.suggest_categorical("criterion", ["gini", "entropy"])
    x, y = load_wine(return_X_y=True)
    mlflow.set_experiment("tune-wine")
    with mlflow.start_run(tags=trial.run_tags()) as run:
        trial.set_run(run.info.run_id)
        mlflow.log_params({"max_depth": depth, "criterion": criterion})
        scores: list[float] = []
        folds = StratifiedKFold(n_splits=3, shuffle=True, random_state=0)
        for step, (train, test) in enumerate(folds.split(x, y)):
            model = DecisionTreeClassifier(max_depth=depth, criterion=criterion, random_state=0)
            scores.append(float(model.fit(x[train], y[train]).score(x[test], y[test])))
            mean = sum(scores) / len(scores)
            mlflow.log_metric("cv_accuracy", mean, step=step)
            trial.report(step, mean)
            if trial.should_prune():
                trial.prune()
                return
        final = DecisionTreeClassifier(max_depth=depth, criterion=criterion, random_state=0)
        mlflow.sklearn.log_model(  # the tree is ours: its node storage type is trusted
            final.fit(x, y),
            name="model",
            skops_trusted_types=["sklearn.tree._tree.Tree"],
            pip_requirements=["scikit-learn"],
        )
        trial.complete(sum(scores) / len(scores))


if __name__ == "__main__":
    main()
