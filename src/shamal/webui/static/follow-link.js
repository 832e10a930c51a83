// The stock MLflow client prints links such as http://HOST/#/experiments/1/runs/<id>:
// the part after '#' never reaches the server, so this page follows it here.
const match = /^#\/experiments\/([0-9]{1,18})(?:\/runs\/([0-9a-f]{32}))?\/?$/.exec(location.hash);
if (match) {
  const [, experiment, run] = match;
  location.replace(run ? `/ui/experiments/${experiment}/runs/${run}` : `/ui/experiments/${experiment}`);
}
