// ACTIVATE pages: the dialog, row menus, copying to the clipboard, confirmations.
// htmx does the requests; this file only adds what HTML cannot say by itself.
(function () {
  "use strict";

  function announce(text) {
    const region = document.getElementById("announce");
    if (region) region.textContent = text;
  }

  function closeMenus(except) {
    document.querySelectorAll("details.menu[open]").forEach(function (menu) {
      if (menu !== except) menu.removeAttribute("open");
    });
  }

  // A fragment swapped into the dialog opens it (Create, Delete worker).
  document.addEventListener("htmx:afterSwap", function (event) {
    const dialog = document.getElementById("dialog");
    // (A page restored from htmx's history swaps with no target.)
    const target = event.detail.target;
    if (dialog && target && target.id === "dialog-body" && !dialog.open) {
      closeMenus(null);
      dialog.showModal();
    }
  });

  // The Workers table is replaced every two seconds, and no refresh starts while a row's menu is
  // open; one already on its way is dropped if a menu opened meanwhile (the next one brings the
  // news), so the menu does not close under the user's pointer.
  document.addEventListener("htmx:beforeSwap", function (event) {
    const target = event.detail.target;
    if (target && target.id === "workers-table" && target.querySelector("details.menu[open]")) {
      event.detail.shouldSwap = false;
    }
  });

  document.addEventListener("close", function (event) {
    if (event.target.id === "dialog") {
      document.getElementById("dialog-body").replaceChildren();
    }
  }, true);

  function copyWithSelection(text) {
    const area = document.createElement("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.style.position = "fixed";
    area.style.opacity = "0";
    document.body.appendChild(area);
    area.select();
    let copied = false;
    try {
      copied = document.execCommand("copy");
    } catch (_) {
      copied = false;
    }
    area.remove();
    return copied;
  }

  function copy(button) {
    const text = button.dataset.copy;
    const original = button.dataset.label || button.textContent;
    button.dataset.label = original;
    function done(copied) {
      button.textContent = copied ? "Copied" : "Select and copy it by hand";
      announce(copied ? "Copied: " + text : "Could not copy");
      window.setTimeout(function () {
        button.textContent = original;
        const menu = button.closest("details.menu");
        if (menu && copied) menu.removeAttribute("open");
      }, 1200);
    }
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(
        function () { done(true); },
        function () { done(copyWithSelection(text)); }
      );
    } else {
      done(copyWithSelection(text));
    }
  }

  document.addEventListener("click", function (event) {
    const target = event.target instanceof Element ? event.target : null;
    if (!target) return;
    const closer = target.closest("[data-close]");
    if (closer && closer.closest("dialog")) {
      event.preventDefault();
      closer.closest("dialog").close();
      return;
    }
    const copier = target.closest("[data-copy]");
    if (copier) {
      event.preventDefault();
      copy(copier);
      return;
    }
    // A link that opens elsewhere (Open in terminal: a new tab) leaves its menu closed.
    if (target.closest("details.menu a[target=_blank]")) {
      closeMenus(null);
      return;
    }
    // One row menu open at a time; a click elsewhere closes it.
    closeMenus(target.closest("details.menu"));
  });

  document.addEventListener("keydown", function (event) {
    if (event.key === "Escape") {
      const open = document.querySelector("details.menu[open]");
      if (open) {
        open.removeAttribute("open");
        open.querySelector("summary").focus();
      }
    }
  });

  document.addEventListener("submit", function (event) {
    const form = event.target;
    if (form instanceof HTMLFormElement && form.dataset.confirm && !window.confirm(form.dataset.confirm)) {
      event.preventDefault();
    }
  });
})();
