// New notices of the user (a worker connected, a wall time running out, an idle worker or
// session about to end, with its Keep button), picked up every few
// seconds: a banner on the page, and a browser notification as well when the tab is in the
// background and the user allowed them.
(function () {
  "use strict";
  const EVERY_MS = 3000;

  function banner(host, notice) {
    const item = document.createElement("p");
    item.className = "message message-notice";
    item.dataset.notice = String(notice.id);
    const title = document.createElement("strong");
    title.textContent = notice.title;
    item.append(title, " " + notice.body + " ");
    if (notice.keep) {
      const keep = document.createElement("button");
      keep.type = "button";
      keep.className = "button";
      keep.textContent = "Keep";
      keep.addEventListener("click", async () => {
        keep.disabled = true;
        const answer = await fetch(notice.keep, {
          method: "POST",
          credentials: "same-origin",
          headers: { Accept: "application/json", "X-CSRFToken": host.dataset.csrf || "" },
        }).catch(() => null);
        if (answer && answer.ok) item.remove();
        else keep.disabled = false;
      });
      item.append(keep, " ");
    }
    const close = document.createElement("button");
    close.type = "button";
    close.className = "link";
    close.textContent = "Dismiss";
    close.addEventListener("click", () => item.remove());
    item.append(close);
    host.append(item);
  }

  function notify(notice) {
    if (!("Notification" in window) || Notification.permission !== "granted") return;
    if (!document.hidden) return;
    new Notification(notice.title, { body: notice.body, tag: "activate-notice-" + notice.id });
  }

  function start() {
    const host = document.getElementById("notices");
    if (!host || !host.dataset.feed) return;
    let after = Number(host.dataset.after || "0");
    async function poll() {
      try {
        const answer = await fetch(host.dataset.feed + "?after=" + after, {
          credentials: "same-origin",
          headers: { Accept: "application/json" },
        });
        if (answer.ok && (answer.headers.get("Content-Type") || "").includes("json")) {
          for (const notice of (await answer.json()).notices) {
            after = Math.max(after, notice.id);
            banner(host, notice);
            notify(notice);
          }
        }
      } catch (error) {
        // Offline for a moment: the next poll picks up where this one stopped.
      }
      setTimeout(poll, EVERY_MS);
    }
    setTimeout(poll, EVERY_MS);
    const ask = document.getElementById("allow-notifications");
    if (ask && "Notification" in window) {
      const say = () => {
        ask.textContent = Notification.permission === "granted"
          ? "Browser notifications are on"
          : "Turn on browser notifications";
        ask.disabled = Notification.permission !== "default";
      };
      say();
      ask.addEventListener("click", () => Notification.requestPermission().then(say));
    }
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
