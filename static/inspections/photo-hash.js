// The inspector's portal: SHA-256 of each chosen photograph, computed in this browser (WebCrypto) and added to
// the photo hashes field, one per line. The photographs never leave the machine; only their hashes are recorded.
(function () {
  "use strict";
  const input = document.getElementById("photo-files");
  const field = document.getElementById("id_photo_hashes");
  const status = document.getElementById("photo-status");
  if (!input || !field) return;
  if (!(window.crypto && crypto.subtle)) {
    input.disabled = true;
    status.textContent = "this browser cannot hash here (WebCrypto needs HTTPS or localhost): enter the hashes by hand";
    return;
  }
  const hex = (buffer) => Array.from(new Uint8Array(buffer), (b) => b.toString(16).padStart(2, "0")).join("");
  input.addEventListener("change", async () => {
    const files = Array.from(input.files);
    status.textContent = "hashing " + files.length + " file(s)…";
    const known = new Set(field.value.split(/\s+/).filter(Boolean));
    for (const file of files) {
      known.add(hex(await crypto.subtle.digest("SHA-256", await file.arrayBuffer())));
    }
    field.value = Array.from(known).join("\n");
    status.textContent = files.length + " photograph(s) hashed";
    status.dataset.done = String(files.length);
  });
})();
