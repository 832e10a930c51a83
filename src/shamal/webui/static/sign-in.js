// Keep an MLflow link's fragment (#/experiments/1/runs/<id>) across signing in: the server
// checks its shape and sends the person to the matching page afterwards.
const field = document.getElementById("fragment");
if (field) {
  field.value = location.hash.slice(0, 300);
}
