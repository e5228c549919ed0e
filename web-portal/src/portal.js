// Live VM states: every 3 s, ask the page's feed (the element #live names
// it) for the tenant's VMs and rewrite each state shown for them. The
// page's own HTML stays the truth without JavaScript.
(function () {
  var live = document.getElementById('live');
  if (!live || !window.fetch) return;
  function refresh() {
    fetch(live.dataset.src, { credentials: 'same-origin', headers: { Accept: 'application/json' } })
      .then(function (r) { return r.ok ? r.json() : []; })
      .then(function (vms) {
        vms.forEach(function (v) {
          document.querySelectorAll('.state[data-vm]').forEach(function (el) {
            if (el.dataset.vm === v.name && el.dataset.state !== v.state) {
              el.dataset.state = v.state;
              el.textContent = v.label;
            }
          });
        });
      })
      .catch(function () {})
      .then(function () { setTimeout(refresh, 3000); });
  }
  setTimeout(refresh, 3000);
})();

// A form marked data-autosubmit (the CLI sign-in's hand-over to the
// command's loopback port) posts itself; without JavaScript its button does.
(function () {
  var form = document.querySelector('form[data-autosubmit]');
  if (form) form.submit();
})();
