// The browser terminal: xterm.js on the platform's terminal WebSocket (protocol in
// workers_app/terminals/consumer.py). Output frames carry a stream byte first.
(function () {
  "use strict";
  const host = document.getElementById("terminal");
  const state = document.getElementById("terminal-state");
  const again = document.getElementById("terminal-reconnect");
  const encoder = new TextEncoder();
  const term = new Terminal({
    cursorBlink: true,
    scrollback: 5000,
    fontSize: 14,
    fontFamily: '"DejaVu Sans Mono", "Liberation Mono", ui-monospace, monospace',
  });
  const fit = new FitAddon.FitAddon();
  term.loadAddon(fit);
  term.open(host);
  fit.fit();
  let socket = null;
  // The folder it was opened in: only the first start asks for it, so that reconnecting to a
  // kept terminal does not open another window there each time.
  let cwd = host.dataset.cwd || "";

  function show(text, kind) {
    state.textContent = text;
    state.className = "badge" + (kind ? " status-" + kind : "");
  }

  function send(message) {
    if (socket && socket.readyState === WebSocket.OPEN) socket.send(message);
  }

  function connect() {
    again.hidden = true;
    show("Connecting…", "queued");
    const url = new URL(host.dataset.socket, window.location.href);
    url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
    socket = new WebSocket(url);
    socket.binaryType = "arraybuffer";
    let ended = false;
    socket.onopen = function () {
      // A kept terminal (tmux on the node): reconnecting, or opening it again in another tab,
      // attaches to the same shell.
      socket.send(JSON.stringify({
        type: "start", command: [], pty: true, cols: term.cols, rows: term.rows, client: "browser",
        keep: host.dataset.keep || "", cwd: cwd,
      }));
    };
    socket.onmessage = function (event) {
      if (typeof event.data !== "string") {
        term.write(new Uint8Array(event.data).subarray(1));
        return;
      }
      const message = JSON.parse(event.data);
      if (message.type === "started") {
        cwd = "";
        show("Connected", "connected");
        term.focus();
      } else if (message.type === "exit") {
        ended = true;
        term.write("\r\n[the shell exited with status " + message.status + "]\r\n");
        show("Exited (" + message.status + ")", "stopped");
      } else if (message.type === "error") {
        ended = true;
        term.write("\r\n[" + message.message + "]\r\n");
        show("Closed", "error");
      }
    };
    socket.onclose = function (event) {
      if (!ended) {
        term.write("\r\n[connection lost (" + event.code + "); the shell on the node ended]\r\n");
        show("Disconnected", "error");
      }
      again.hidden = false;
      socket = null;
    };
  }

  term.onData(function (data) { send(encoder.encode(data)); });
  term.onBinary(function (data) {
    send(Uint8Array.from(data, function (c) { return c.charCodeAt(0); }));
  });
  term.onResize(function (size) {
    send(JSON.stringify({ type: "resize", cols: size.cols, rows: size.rows }));
  });
  term.attachCustomKeyEventHandler(function (event) {
    if (event.type !== "keydown" || !event.ctrlKey || !event.shiftKey) return true;
    if (event.code === "KeyC" && term.hasSelection()) {
      navigator.clipboard.writeText(term.getSelection());
      return false;
    }
    // Ctrl+Shift+V is left to the browser: its paste event reaches xterm.js, which sends it.
    return true;
  });
  window.addEventListener("resize", function () { fit.fit(); });
  again.addEventListener("click", function () { term.reset(); connect(); });
  connect();
})();
