// The Files page: the listing is the server's (htmx swaps #files-listing when a folder is
// entered); this adds what HTML cannot say: uploads (drag and drop or the picker, each file with
// its progress, cancel and error), the new folder, rename and delete dialogs over the files API,
// and hidden files shown or not. Paths are bytes the user chose (not always UTF-8): they travel
// as urlsafe base64, and whatever the page shows of them is put in as text, never as markup.
(function () {
  "use strict";

  const root = document.getElementById("files");
  if (!root) return;
  const API = root.dataset.api;
  const STREAM = root.dataset.stream;
  const CSRF = root.dataset.csrf;
  const PARALLEL_UPLOADS = 2;
  const SLASH = 0x2f;

  const $ = function (id) { return document.getElementById(id); };
  const drop = $("files-drop");
  const dialog = $("files-dialog");
  const form = $("files-form");

  // The folder shown: its path for display, its bytes as base64, whether it could be listed.
  function here() {
    const listing = $("files-listing");
    return {
      path: listing.dataset.path,
      b64: listing.dataset.pathB64,
      url: listing.dataset.url,
      readable: listing.hasAttribute("data-readable"),
    };
  }

  // Bytes and their base64 (the API's *_b64: urlsafe, padded).

  function bytesOf(b64) {
    let text = String(b64 || "").replace(/-/g, "+").replace(/_/g, "/");
    while (text.length % 4) text += "=";
    const raw = atob(text);
    const bytes = new Uint8Array(raw.length);
    for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
    return bytes;
  }

  function b64Of(bytes) {
    let raw = "";
    for (let i = 0; i < bytes.length; i += 0x8000) {
      raw += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
    }
    return btoa(raw).replace(/\+/g, "-").replace(/\//g, "_");
  }

  // A name (text, as typed or as the browser gives a file's) in a folder (bytes, base64).
  function joined(folderB64, name) {
    const folder = bytesOf(folderB64);
    const tail = new TextEncoder().encode(name);
    const slash = folder.length && folder[folder.length - 1] === SLASH ? 0 : 1;
    const out = new Uint8Array(folder.length + slash + tail.length);
    out.set(folder, 0);
    if (slash) out[folder.length] = SLASH;
    out.set(tail, folder.length + slash);
    return b64Of(out);
  }

  function el(tag, props, children) {
    const node = document.createElement(tag);
    Object.entries(props || {}).forEach(function ([key, value]) {
      if (value === undefined || value === null || value === false) return;
      if (key === "text") node.textContent = value;
      else if (key === "className") node.className = value;
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? "" : value);
    });
    (children || []).forEach(function (child) { if (child) node.append(child); });
    return node;
  }

  function humanSize(size) {
    const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let value = Number(size), unit = 0;
    while (value >= 1024 && unit < units.length - 1) { value /= 1024; unit++; }
    return unit === 0 ? value + " B" : value.toFixed(value < 10 ? 1 : 0) + " " + units[unit];
  }

  function count(n, noun) { return n + " " + noun + (n === 1 ? "" : "s"); }

  function say(text) {
    const region = $("announce");
    if (region) region.textContent = text;
  }

  // The listing again, from the server, where it is (no new history entry).
  function refresh() {
    return htmx.ajax("GET", here().url, { target: "#files-listing", swap: "outerHTML" });
  }

  function syncTools() {
    const readable = here().readable;
    $("files-new-folder").disabled = !readable;
    $("files-pick").disabled = !readable;
  }

  document.body.addEventListener("htmx:historyRestore", syncTools);
  document.body.addEventListener("htmx:afterSwap", function (event) {
    const target = event.detail && event.detail.target;
    if (!target || (target.id !== "files-listing" && !$("files-listing").contains(target))) return;
    syncTools();
    // Entering a folder by a link moves the focus to its name in the path.
    const from = event.detail.requestConfig && event.detail.requestConfig.elt;
    if (from && from.tagName === "A") {
      $("files-here").focus();
      say("Folder " + here().path);
    }
  });

  // The API, for changes (and the count a folder's delete says).

  async function call(url, what, payload) {
    const options = {
      method: payload === undefined ? "GET" : "POST",
      credentials: "same-origin",
      headers: { Accept: "application/json", "X-CSRFToken": CSRF },
    };
    if (payload !== undefined) {
      options.headers["Content-Type"] = "application/json";
      options.body = JSON.stringify(payload);
    }
    let response;
    try {
      response = await fetch(url, options);
    } catch (_) {
      throw new Error("The platform could not be reached: check your connection and try again.");
    }
    let answer = null;
    try { answer = await response.json(); } catch (_) { answer = null; }
    if (response.ok) return answer;
    const detail = answer && typeof answer.detail === "string" ? answer.detail : "";
    if (response.status === 403) throw new Error("Permission denied: the cluster does not let your account " + what + (detail ? " (" + detail + ")." : "."));
    if (response.status === 404) throw new Error("Not found: " + (detail || "it is gone.") + " Refresh to see the folder as it is now.");
    if (response.status === 409) throw new Error("That name is taken here: choose another.");
    throw new Error(detail || "The platform answered " + response.status + " when asked to " + what + ".");
  }

  // Dialogs: new folder, rename, delete.

  let onSubmit = null;

  function ask(config) {
    $("files-dialog-title").textContent = config.title;
    $("files-dialog-text").textContent = config.text || "";
    $("files-dialog-text").hidden = !config.text;
    $("files-dialog-field").hidden = !config.field;
    const input = $("files-dialog-name");
    input.value = config.value || "";
    const submit = $("files-dialog-submit");
    submit.textContent = config.button;
    submit.className = config.danger ? "danger" : "primary";
    submit.disabled = false;
    fieldError("");
    onSubmit = config.submit;
    dialog.showModal();
    if (config.field) {
      input.focus();
      const dot = input.value.lastIndexOf(".");
      input.setSelectionRange(0, dot > 0 ? dot : input.value.length);
    } else {
      submit.focus();
    }
  }

  function fieldError(text) {
    const error = $("files-dialog-error");
    error.textContent = text;
    error.hidden = !text;
    $("files-dialog-name").setAttribute("aria-invalid", text ? "true" : "false");
  }

  function nameProblem(name) {
    if (!name) return "Give it a name.";
    if (name.includes("/")) return "A name cannot hold a slash (/).";
    if (name === "." || name === "..") return "“" + name + "” is taken by every folder: choose another.";
    if (name.includes("\0")) return "A name cannot hold a NUL character.";
    return "";
  }

  form.addEventListener("submit", async function (event) {
    event.preventDefault();
    if (!onSubmit) return;
    const name = $("files-dialog-name").value;
    if (!$("files-dialog-field").hidden) {
      const wrong = nameProblem(name);
      if (wrong) { fieldError(wrong); $("files-dialog-name").focus(); return; }
    }
    const submit = $("files-dialog-submit");
    submit.disabled = true;
    try {
      const done = await onSubmit(name);
      dialog.close();
      await refresh();
      if (done.said) say(done.said);
      // The focus goes to what was made or renamed, else to the folder's name.
      const made = done && done.name !== undefined
        ? Array.from(document.querySelectorAll("#files-body tr[data-name] a.entry-name")).find(function (link) {
          return link.closest("tr").dataset.name === done.name;
        })
        : null;
      (made || $("files-here")).focus();
    } catch (error) {
      fieldError(error.message);
      submit.disabled = false;
    }
  });

  dialog.addEventListener("close", function () { onSubmit = null; });

  $("files-new-folder").addEventListener("click", function () {
    const folder = here();
    ask({
      title: "New folder",
      text: "In " + folder.path,
      field: true,
      button: "Create folder",
      submit: async function (name) {
        await call(API + "mkdir/", "make a folder here", { path_b64: joined(folder.b64, name) });
        return { said: "Folder " + name + " made.", name: name };
      },
    });
  });

  function askRename(entry) {
    const folder = here();
    ask({
      title: "Rename " + entry.name,
      field: true,
      value: entry.name,
      button: "Rename",
      submit: async function (name) {
        if (name === entry.name) return { said: "", name: name };
        await call(API + "rename/", "rename it", { from_b64: entry.b64, to_b64: joined(folder.b64, name) });
        return { said: entry.name + " renamed to " + name + ".", name: name };
      },
    });
  }

  async function askDelete(entry) {
    if (entry.type !== "dir") {
      ask({
        title: "Delete " + entry.name + "?",
        text: "It is deleted from the cluster. This cannot be undone.",
        button: "Delete file",
        danger: true,
        submit: async function () {
          await call(API + "delete/", "delete it", { path_b64: entry.b64, recursive: false });
          return { said: entry.name + " deleted." };
        },
      });
      return;
    }
    let text;
    try {
      const inside = (await call(API + "?path_b64=" + encodeURIComponent(entry.b64), "list it")).entries || [];
      const folders = inside.filter(function (e) { return e.type === "dir"; }).length;
      if (!inside.length) text = "The folder is empty.";
      else text = "It holds " + count(inside.length, "item") + (folders ? ", " + folders + " of them " + (folders === 1 ? "a folder" : "folders") : "") + ": all of it is deleted with the folder.";
    } catch (error) {
      text = "What it holds could not be listed: " + error.message;
    }
    ask({
      title: "Delete the folder " + entry.name + "?",
      text: text + " This cannot be undone.",
      button: "Delete folder",
      danger: true,
      submit: async function () {
        await call(API + "delete/", "delete it", { path_b64: entry.b64, recursive: true });
        return { said: "Folder " + entry.name + " deleted." };
      },
    });
  }

  function entryOf(tr) {
    return { name: tr.dataset.name, b64: tr.dataset.pathB64, type: tr.dataset.type };
  }

  document.addEventListener("click", function (event) {
    const target = event.target instanceof Element ? event.target : null;
    const button = target && target.closest("#files-listing [data-rename], #files-listing [data-delete]");
    if (!button) return;
    const menu = button.closest("details.menu");
    if (menu) menu.removeAttribute("open");
    const entry = entryOf(button.closest("tr"));
    if (button.hasAttribute("data-rename")) askRename(entry);
    else askDelete(entry);
  });

  // Uploads: each file its own row, progress bar, cancel and error; two at a time.

  const queue = [];
  let running = 0;

  function enqueue(files, folderB64, folderLabel) {
    $("files-uploads").hidden = false;
    files.forEach(function (file) {
      const upload = { file: file, folder: folderB64, folderLabel: folderLabel, overwrite: false };
      upload.bar = el("progress", { max: "100", value: "0", "aria-label": "Upload of " + file.name });
      upload.status = el("span", { className: "upload-status", text: "Waiting" });
      upload.buttons = el("span", { className: "upload-buttons" });
      upload.item = el("li", { className: "upload", "data-state": "waiting" }, [
        el("div", { className: "upload-head" }, [
          el("span", { className: "upload-name", text: file.name }),
          el("span", { className: "muted", text: humanSize(file.size) + " → " + folderLabel }),
        ]),
        upload.bar,
        el("div", { className: "upload-foot" }, [upload.status, upload.buttons]),
      ]);
      $("upload-list").append(upload.item);
      waiting(upload);
    });
    say(count(files.length, "file") + " to upload to " + folderLabel);
    pump();
  }

  function cancelButton(upload, cancel) {
    return el("button", {
      type: "button", className: "small", text: "Cancel", "aria-label": "Cancel the upload of " + upload.file.name,
      onclick: cancel,
    });
  }

  function waiting(upload) {
    upload.item.dataset.state = "waiting";
    upload.status.textContent = "Waiting";
    upload.bar.value = 0;
    upload.buttons.replaceChildren(cancelButton(upload, function () {
      const at = queue.indexOf(upload);
      if (at >= 0) queue.splice(at, 1);
      finish(upload, "cancelled", "Cancelled: nothing was sent.");
    }));
    queue.push(upload);
  }

  function pump() {
    while (running < PARALLEL_UPLOADS && queue.length) send(queue.shift());
  }

  function finish(upload, state, text, buttons) {
    upload.item.dataset.state = state;
    upload.status.textContent = text;
    upload.buttons.replaceChildren(...(buttons || []));
    say(upload.file.name + ": " + text);
  }

  function failed(upload, text, retry) {
    upload.bar.value = 0;
    finish(upload, "failed", text, retry === false ? [] : [el("button", {
      type: "button", className: "small", text: "Try again", "aria-label": "Try the upload of " + upload.file.name + " again",
      onclick: function () { waiting(upload); pump(); },
    })]);
  }

  function send(upload) {
    running++;
    const xhr = new XMLHttpRequest();
    const target = joined(upload.folder, upload.file.name);
    xhr.open("PUT", STREAM + "upload?path_b64=" + encodeURIComponent(target) + "&overwrite=" + (upload.overwrite ? "1" : "0"));
    xhr.setRequestHeader("X-CSRFToken", CSRF);
    xhr.setRequestHeader("Content-Type", "application/octet-stream");
    xhr.setRequestHeader("Accept", "application/json");
    upload.item.dataset.state = "sending";
    upload.status.textContent = "Starting";
    upload.buttons.replaceChildren(cancelButton(upload, function () { xhr.abort(); }));
    let spoken = 0;
    xhr.upload.addEventListener("progress", function (event) {
      if (!event.lengthComputable) return;
      const percent = event.total ? Math.floor((event.loaded / event.total) * 100) : 100;
      upload.bar.value = percent;
      upload.status.textContent = percent + "% · " + humanSize(event.loaded) + " of " + humanSize(event.total);
      // The live region hears a quarter at a time, not every step.
      if (percent >= spoken + 25 && percent < 100) {
        spoken = percent - (percent % 25);
        say(upload.file.name + ": " + spoken + "%");
      }
    });
    xhr.upload.addEventListener("load", function () {
      upload.bar.value = 100;
      upload.status.textContent = "Saving on the cluster…";
    });
    xhr.addEventListener("loadend", function () {
      running--;
      pump();
    });
    xhr.addEventListener("load", function () {
      let answer = null;
      try { answer = JSON.parse(xhr.responseText); } catch (_) { answer = null; }
      const detail = answer && typeof answer.detail === "string" ? answer.detail : "";
      if (xhr.status >= 200 && xhr.status < 300) {
        upload.bar.value = 100;
        finish(upload, "done", "Uploaded");
        refresh();
      } else if (xhr.status === 409) {
        upload.bar.value = 0;
        finish(upload, "exists", "A file of this name is already in " + upload.folderLabel + ".", [
          el("button", {
            type: "button", className: "small danger", text: "Replace it", "aria-label": "Replace " + upload.file.name,
            onclick: function () { upload.overwrite = true; waiting(upload); pump(); },
          }),
          el("button", {
            type: "button", className: "small", text: "Keep it", "aria-label": "Keep the " + upload.file.name + " there",
            onclick: function () { finish(upload, "cancelled", "Not uploaded: the file there is kept."); },
          }),
        ]);
      } else if (xhr.status === 413) {
        failed(upload, "Too large. " + (detail || "The file is over the size limit this platform's operator set."), false);
      } else if (xhr.status === 403) {
        failed(upload, "Permission denied: the cluster does not let your account write there" + (detail ? " (" + detail + ")." : "."));
      } else if (xhr.status === 404) {
        failed(upload, "Not found: " + (detail || "the folder is gone."));
      } else {
        failed(upload, detail || "Upload failed: the platform answered " + xhr.status + ".");
      }
    });
    xhr.addEventListener("error", function () {
      failed(upload, "The connection was lost during the upload: nothing was saved under its name.");
    });
    xhr.addEventListener("abort", function () {
      upload.bar.value = 0;
      finish(upload, "cancelled", "Cancelled: nothing was saved under its name.");
    });
    xhr.send(upload.file);
  }

  $("uploads-clear").addEventListener("click", function () {
    $("upload-list").querySelectorAll("li.upload").forEach(function (item) {
      if (["done", "cancelled", "failed"].includes(item.dataset.state)) item.remove();
    });
    if (!$("upload-list").children.length) $("files-uploads").hidden = true;
  });

  $("files-pick").addEventListener("click", function () { $("files-input").click(); });
  $("files-input").addEventListener("change", function () {
    const files = Array.from(this.files || []);
    const folder = here();
    if (files.length) enqueue(files, folder.b64, folder.path);
    this.value = "";
  });

  // Drag and drop: onto the listing (onto a folder's row: into that folder).

  function carriesFiles(event) {
    return event.dataTransfer && Array.from(event.dataTransfer.types || []).includes("Files");
  }

  function folderRow(event) {
    const tr = event.target instanceof Element ? event.target.closest("#files-body tr[data-type=dir]") : null;
    return tr && drop.contains(tr) ? tr : null;
  }

  function folderLabel(tr) {
    const folder = here();
    return tr ? folder.path.replace(/\/?$/, "/") + tr.dataset.name : folder.path;
  }

  let depth = 0;
  function unmark() {
    drop.classList.remove("dragging");
    drop.querySelectorAll("tr.drop-target").forEach(function (tr) { tr.classList.remove("drop-target"); });
  }

  drop.addEventListener("dragenter", function (event) {
    if (!carriesFiles(event) || !here().readable) return;
    event.preventDefault();
    depth++;
    drop.classList.add("dragging");
  });
  drop.addEventListener("dragover", function (event) {
    if (!carriesFiles(event) || !here().readable) return;
    event.preventDefault();
    event.dataTransfer.dropEffect = "copy";
    const tr = folderRow(event);
    drop.querySelectorAll("tr.drop-target").forEach(function (other) { if (other !== tr) other.classList.remove("drop-target"); });
    if (tr) tr.classList.add("drop-target");
    $("files-drop-folder").textContent = folderLabel(tr);
  });
  drop.addEventListener("dragleave", function () {
    depth = Math.max(0, depth - 1);
    if (!depth) unmark();
  });
  drop.addEventListener("drop", function (event) {
    if (!carriesFiles(event)) return;
    event.preventDefault();
    depth = 0;
    const tr = folderRow(event);
    unmark();
    if (!here().readable) return;
    // A folder dropped from the desktop is a File too, that cannot be read: left out, and said.
    const items = Array.from(event.dataTransfer.items || []);
    const isFolder = items.map(function (item) {
      const entry = item.webkitGetAsEntry ? item.webkitGetAsEntry() : null;
      return !!(entry && entry.isDirectory);
    });
    const files = Array.from(event.dataTransfer.files || []).filter(function (_, i) { return !isFolder[i]; });
    const note = $("files-said");
    note.textContent = isFolder.includes(true)
      ? "Folders are not uploaded by dropping them: make the folder with New folder, then drop the files inside it."
      : "";
    note.hidden = !note.textContent;
    if (!files.length) return;
    enqueue(files, tr ? tr.dataset.pathB64 : here().b64, folderLabel(tr));
  });
  // A file dropped beside the listing would otherwise replace the page with itself.
  window.addEventListener("dragover", function (event) { if (carriesFiles(event)) event.preventDefault(); });
  window.addEventListener("drop", function (event) { if (carriesFiles(event) && !drop.contains(event.target)) event.preventDefault(); });

  // Leaving with uploads under way asks first.
  window.addEventListener("beforeunload", function (event) {
    if (running || queue.length) {
      event.preventDefault();
      event.returnValue = "";
    }
  });

  // Hidden files, shown or not: remembered in this browser.

  function showHidden(shown) {
    root.classList.toggle("show-hidden", shown);
    $("files-dotfiles").checked = shown;
  }
  showHidden(localStorage.getItem("files-dotfiles") === "1");
  $("files-dotfiles").addEventListener("change", function () {
    localStorage.setItem("files-dotfiles", this.checked ? "1" : "0");
    showHidden(this.checked);
  });

  $("files-refresh").addEventListener("click", function () { refresh(); });
  syncTools();
})();
