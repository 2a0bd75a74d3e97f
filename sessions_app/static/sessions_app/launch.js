// The launch form: the chosen type's fields show (the others' are disabled, so they are not
// sent), and the Target list offers only the places that type runs on.
(function () {
  "use strict";
  var type = document.getElementById("launch-type");
  var target = document.getElementById("launch-target");
  if (!type || !target) return;

  function update() {
    var kind = type.value;
    document.querySelectorAll("fieldset.kind-fields").forEach(function (set) {
      var mine = set.getAttribute("data-kind") === kind;
      set.hidden = !mine;
      set.disabled = !mine;
    });
    var firstOffered = null;
    target.querySelectorAll("option").forEach(function (option) {
      var offered = (option.getAttribute("data-kinds") || "").split(" ").indexOf(kind) !== -1;
      option.hidden = !offered;
      option.disabled = !offered;
      if (offered && firstOffered === null) firstOffered = option;
    });
    var chosen = target.options[target.selectedIndex];
    if ((!chosen || chosen.disabled) && firstOffered) firstOffered.selected = true;
  }

  type.addEventListener("change", update);
  update();
})();
