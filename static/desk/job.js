// Poll each unfinished job's JSON and show its progress until it is done or failed.
"use strict";
(function () {
  async function watch(row) {
    for (;;) {
      if (row.dataset.state === "done" || row.dataset.state === "failed") return;
      await new Promise((r) => setTimeout(r, 1000));
      const r = await fetch(row.dataset.jobUrl, { credentials: "same-origin" });
      if (!r.ok) continue;
      const job = await r.json();
      row.dataset.state = job.state;
      row.querySelector("progress").value = job.progress;
      row.querySelector(".job-state").textContent = job.state;
      row.querySelector(".job-message").textContent = job.message;
    }
  }
  document.addEventListener("DOMContentLoaded", () => document.querySelectorAll("tr.job").forEach(watch));
})();
