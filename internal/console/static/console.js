// The overview's live part: fetched again every 2 s and swapped in. The
// fragment is drawn by the server's templates, escaped like every page.
document.addEventListener("DOMContentLoaded", function () {
  document.querySelectorAll("[data-live]").forEach(function (el) {
    var busy = false;
    setInterval(function () {
      if (busy || document.hidden) return;
      busy = true;
      fetch(el.dataset.live, { credentials: "same-origin" })
        .then(function (r) {
          if (r.status === 401) { location.reload(); return null; }
          return r.ok ? r.text() : null;
        })
        .then(function (html) { if (html !== null) { el.innerHTML = html; el.dataset.updated = Date.now(); } })
        .catch(function () {})
        .finally(function () { busy = false; });
    }, 2000);
  });
});

// After a sign-in at the identity provider: go on from this page, a
// navigation of this site, so the session cookie (SameSite=Strict) goes
// with it.
document.addEventListener("DOMContentLoaded", function () {
  var next = document.querySelector("a[data-follow]");
  if (next) location.replace(next.getAttribute("href"));
});

// The namespace switcher: choosing a namespace switches to it.
document.addEventListener("DOMContentLoaded", function () {
  var select = document.getElementById("namespace");
  if (select && select.form) select.addEventListener("change", function () { select.form.submit(); });
});
