// A VM's serial console in the page: asks the portal for a one-time
// ticket (the session's cookie and CSRF token), opens the ticket's
// websocket, and shows it in xterm.js (or, without it, as plain text).
// Binary messages are the terminal's bytes; text messages from the server
// are events (live, took_over, taken_over, read_only, closed); text messages to it
// are controls (resize, keys). A viewer, or a writer who was taken over,
// reads only; "take over" opens it again to type.
(function () {
  var box = document.getElementById('console');
  if (!box || !window.WebSocket || !window.fetch) return;
  var d = box.dataset;
  var status = document.getElementById('console-status');
  var takeOver = document.getElementById('take-over');
  var reconnect = document.getElementById('reconnect');
  var plain = document.getElementById('plain-output');
  var enc = new TextEncoder();
  var dec = new TextDecoder();
  var ws = null;
  var writing = false;
  var term = null;
  if (window.Terminal && document.getElementById('terminal')) {
    term = new window.Terminal({ cols: 100, rows: 30, scrollback: 10000 });
    term.open(document.getElementById('terminal'));
    term.onData(function (s) { if (writing) send(enc.encode(s)); });
  }

  function say(text) { status.textContent = text; }
  function send(data) { if (ws && ws.readyState === 1) ws.send(data); }
  function show(out) {
    if (term) term.write(out);
    else if (plain) plain.textContent += dec.decode(out, { stream: true });
  }

  function event(e) {
    if (e.event === 'took_over') {
      say(d.lWriting + ' ' + d.lTookOver + ' ' + e.from);
    } else if (e.event === 'taken_over') {
      writing = false;
      say(e.by + ' ' + d.lTakenOver);
      takeOver.hidden = false;
    } else if (e.event === 'read_only') {
      writing = false;
      say(d.lReadOnly + ' ' + e.reason);
    } else if (e.event === 'closed') {
      writing = false;
      say(d.lClosed + ' ' + e.reason);
    }
  }

  function connect(mode) {
    takeOver.hidden = true;
    reconnect.hidden = true;
    say(d.lConnecting);
    if (ws) { ws.onclose = null; ws.close(); }
    fetch(d.ticket, {
      method: 'POST',
      credentials: 'same-origin',
      headers: { 'Content-Type': 'application/x-www-form-urlencoded', Accept: 'application/json' },
      body: 'csrf=' + encodeURIComponent(d.csrf) + '&mode=' + mode,
    })
      .then(function (r) { return r.json().then(function (j) { return { status: r.status, body: j }; }); })
      .then(function (r) {
        if (r.status === 403 && mode === 'write') return connect('read');
        if (r.status !== 201) {
          say(d.lClosed + ' ' + (r.body.detail || r.body.title || r.status));
          reconnect.hidden = false;
          return;
        }
        writing = r.body.write;
        if (term) term.reset();
        else if (plain) plain.textContent = '';
        var scheme = location.protocol === 'https:' ? 'wss://' : 'ws://';
        ws = new WebSocket(scheme + location.host + r.body.url);
        ws.binaryType = 'arraybuffer';
        ws.onopen = function () {
          say(writing ? d.lWriting : d.lReading);
          if (!writing) takeOver.hidden = false;
          if (writing && term) {
            send(JSON.stringify({ type: 'resize', cols: term.cols, rows: term.rows }));
            term.focus();
          }
        };
        ws.onmessage = function (m) {
          if (typeof m.data === 'string') event(JSON.parse(m.data));
          else show(new Uint8Array(m.data));
        };
        ws.onclose = function () {
          writing = false;
          reconnect.hidden = false;
          if (status.textContent.indexOf(d.lClosed) !== 0) say(d.lClosed + ' —');
        };
      })
      .catch(function (e) { say(d.lClosed + ' ' + e); reconnect.hidden = false; });
  }

  takeOver.addEventListener('click', function () { connect('write'); });
  reconnect.addEventListener('click', function () { connect('write'); });
  // Sent as typed: newlines become Enter (a carriage return), as a
  // terminal sends them.
  document.getElementById('send-text').addEventListener('submit', function (e) {
    e.preventDefault();
    var box = document.getElementById('paste');
    var text = box.value.replace(/\r?\n/g, '\r');
    if (document.getElementById('paste-enter').checked) text += '\r';
    send(enc.encode(text));
    box.value = '';
    if (term) term.focus();
  });
  document.getElementById('ctrl-alt-del').addEventListener('click', function () {
    send(JSON.stringify({ type: 'keys', keys: 'ctrl-alt-del' }));
  });
  connect('write');
})();
