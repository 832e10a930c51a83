// Keep an MLflow link's fragment (#/experiments/1/runs/<id>) across signing in: the server
// checks its shape and sends the person to the matching page afterwards.
// A one-time sign-in link (#once=<code>, printed by `shamal server --quickstart`) is posted
// at once; the code is taken out of the address bar first. A fragment never reaches the
// server's access log.
const field = document.getElementById("fragment");
const once = document.getElementById("once");
const ONCE = /^#once=([A-Za-z0-9_-]{16,128})$/;
const found = ONCE.exec(location.hash);
if (found && once) {
  history.replaceState(null, "", location.pathname + location.search);
  once.value = found[1];
  once.form.submit();
} else if (field) {
  field.value = location.hash.slice(0, 300);
}
