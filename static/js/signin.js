// Sign in with Google calls this with the ID token it issued for this app: post it to /signin, where the server
// checks it (core/identity.py). Named on window, as the button's data-callback asks.
window.signedInWithGoogle = function (response) {
  const form = document.getElementById("google-signin");
  form.elements.credential.value = response.credential;
  form.submit();
};
