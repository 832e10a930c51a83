// The stock MLflow client prints links such as http://HOST/#/experiments/1/runs/<id>:
// the part after '#' never reaches the server, so this page follows it here: to MLflow's
// own UI when the server has it (data-stock-ui="/mlflow/"), else to Shamal's page.
const match = /^#\/experiments\/([0-9]{1,18})(?:\/runs\/([0-9a-f]{32}))?\/?$/.exec(location.hash);
const stockUi = document.querySelector("script[data-stock-ui]")?.dataset.stockUi;
if (match) {
  const [, experiment, run] = match;
  if (stockUi === "/mlflow/") {
    location.replace(`/mlflow/${match[0].replace(/\/$/, "")}`);
  } else {
    location.replace(run ? `/ui/experiments/${experiment}/runs/${run}` : `/ui/experiments/${experiment}`);
  }
}
