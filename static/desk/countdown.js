// The campaign page's next draw: "in 3 d 4 h 12 min" beside its date, updated every second.
(function () {
  function left(ms) {
    if (ms <= 0) return "due: the scheduler draws it on its next run";
    const s = Math.floor(ms / 1000), d = Math.floor(s / 86400), h = Math.floor((s % 86400) / 3600);
    const m = Math.floor((s % 3600) / 60), sec = s % 60;
    return "in " + (d ? d + " d " : "") + (d || h ? h + " h " : "") + m + " min " + (d ? "" : sec + " s");
  }
  function tick() {
    document.querySelectorAll(".countdown[data-at]").forEach(function (el) {
      el.textContent = left(Date.parse(el.dataset.at) - Date.now());
    });
  }
  tick();
  setInterval(tick, 1000);
})();
