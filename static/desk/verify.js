// Verify a chip's timeline in the browser, trusting only the log's public key (pinned here on first use).
// For each entry: fetch its leaf and an RFC 9162 inclusion proof from the public ledger API, recompute
// SHA-256(0x00 || leaf), fold the proof to a root, and compare it with the root of the signed checkpoint,
// whose C2SP signed-note signature is checked with Ed25519 (WebCrypto).
"use strict";
(function () {
  const API = "/api/ledger/";
  const enc = new TextEncoder();
  const b64 = (s) => Uint8Array.from(atob(s), (c) => c.charCodeAt(0));
  const hex = (u) => Array.from(u, (b) => b.toString(16).padStart(2, "0")).join("");
  const equal = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);
  const sha256 = async (...parts) => {
    const all = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
    let at = 0;
    for (const p of parts) { all.set(p, at); at += p.length; }
    return new Uint8Array(await crypto.subtle.digest("SHA-256", all));
  };
  const ZERO = Uint8Array.of(0), ONE = Uint8Array.of(1);

  async function text(path) {
    const r = await fetch(API + path, { credentials: "omit" });
    if (!r.ok) throw new Error(path + ": HTTP " + r.status);
    return r.text();
  }

  // "<origin>+<hex keyid>+<base64(0x01 || pubkey)>" -> {name, keyId, publicKey}
  function parseVerifierKey(line) {
    // The name holds no "+", the base64 key may: split at the first two only.
    const text = line.trim(), i = text.indexOf("+"), j = text.indexOf("+", i + 1);
    if (i < 1 || j < 0) throw new Error("verifier key is malformed");
    const parts = [text.slice(0, i), text.slice(i + 1, j), text.slice(j + 1)];
    const raw = b64(parts[2]);
    if (raw.length !== 33 || raw[0] !== 1) throw new Error("verifier key is not Ed25519");
    return { name: parts[0], keyId: parts[1], publicKey: raw.slice(1) };
  }

  async function pinnedKey() {
    const served = (await text("key")).trim();
    const pinned = localStorage.getItem("chipledger.verifierKey");
    if (pinned && pinned !== served) throw new Error("the server's log key differs from the one pinned in this browser");
    if (!pinned) localStorage.setItem("chipledger.verifierKey", served);
    return parseVerifierKey(served);
  }

  // C2SP signed note: body lines, a blank line, then "— <name> <base64(keyid4 || sig64)>" lines.
  async function openCheckpoint(note, key) {
    const split = note.indexOf("\n\n");
    if (split < 0) throw new Error("checkpoint is not a signed note");
    const body = note.slice(0, split + 1);
    const keyId = await sha256(enc.encode(key.name + "\n"), ONE, key.publicKey);
    const cryptoKey = await crypto.subtle.importKey("raw", key.publicKey, { name: "Ed25519" }, false, ["verify"]);
    let signed = false;
    for (const line of note.slice(split + 2).split("\n")) {
      const m = line.match(/^\u2014 (\S+) (\S+)$/);
      if (!m || m[1] !== key.name) continue;
      const blob = b64(m[2]);
      if (blob.length !== 68 || !equal(blob.slice(0, 4), keyId.slice(0, 4))) continue;
      if (await crypto.subtle.verify({ name: "Ed25519" }, cryptoKey, blob.slice(4), enc.encode(body))) signed = true;
    }
    if (!signed) throw new Error("checkpoint signature does not verify with the log's key");
    const lines = body.split("\n");
    if (lines[0] !== key.name) throw new Error("checkpoint origin is not the log's");
    return { size: Number(lines[1]), root: b64(lines[2]) };
  }

  // RFC 9162 section 2.1.3.2: fold an inclusion proof to a root.
  async function rootFromProof(index, size, leafHash, proof) {
    if (index >= size) throw new Error("index beyond tree size");
    let fn = index, sn = size - 1, r = leafHash;
    for (const p of proof) {
      if (sn === 0) throw new Error("proof is too long");
      if (fn % 2 === 1 || fn === sn) {
        r = await sha256(ONE, p, r);
        if (fn % 2 === 0) { while (fn % 2 === 0 && fn !== 0) { fn = Math.floor(fn / 2); sn = Math.floor(sn / 2); } }
      } else {
        r = await sha256(ONE, r, p);
      }
      fn = Math.floor(fn / 2); sn = Math.floor(sn / 2);
    }
    if (sn !== 0) throw new Error("proof is too short");
    return r;
  }

  // One entry's leaf, checked: its hash is included in the signed checkpoint (RFC 9162 proof) and it is entry seq.
  async function verifiedLeaf(seq, checkpoint) {
    if (!(seq < checkpoint.size)) throw new Error(`entry ${seq} is not yet in the signed checkpoint (size ${checkpoint.size}): try again after the next one`);
    const page = JSON.parse(await text(`entries?start=${seq}&end=${seq + 1}`));
    if (!page.entries || page.entries.length !== 1) throw new Error(`the log served no entry ${seq}`);
    const leaf = b64(page.entries[0].leaf);
    const parsed = JSON.parse(new TextDecoder().decode(leaf));
    if (parsed.seq !== seq) throw new Error(`the leaf served for ${seq} is entry ${parsed.seq}`);
    const leafHash = await sha256(ZERO, leaf);
    const proof = JSON.parse(await text(`proof/inclusion?index=${seq}&size=${checkpoint.size}`));
    const root = await rootFromProof(seq, checkpoint.size, leafHash, proof.hashes.map(b64));
    if (!equal(root, checkpoint.root)) throw new Error("inclusion proof does not lead to the signed root");
    return { parsed, leafHash };
  }

  // What the page shows of an entry, derived from its leaf exactly as the server's desk.selectors._about does.
  function shownByLeaf(entry, serial) {
    const p = entry.payload || {};
    let item = p;
    if (entry.kind === "chip.fabricated") item = (p.chips || []).find((c) => c && c.serial === serial) || {};
    return {
      kind: entry.kind,
      actor: entry.actor,
      counterparty: p.consignee || p.to_owner || p.prover || "",
      facility: item.facility || "",
      country: p.country || p.destination_country || "",
    };
  }

  const cellText = (row, cls) => { const c = row.querySelector("." + cls); return c ? c.textContent.trim() : ""; };

  async function verifyRow(row, checkpoint, serial) {
    const seq = Number(row.dataset.seq);
    const { parsed, leafHash } = await verifiedLeaf(seq, checkpoint);
    const want = shownByLeaf(parsed, serial);
    for (const field of ["kind", "actor", "counterparty", "facility"]) {
      if (cellText(row, "f-" + field) !== want[field]) return { ok: false, why: `the ${field} shown is not the leaf's (${JSON.stringify(want[field])})` };
    }
    const time = row.querySelector(".f-time time");
    if (!time || Date.parse(time.getAttribute("datetime")) !== Date.parse(parsed.time)) return { ok: false, why: "the time shown is not the leaf's" };
    time.textContent = parsed.time.replace("T", " ").replace(/\.\d+Z$/, " UTC");  // show the verified value itself
    let country = want.country;
    const place = row.querySelector(".f-place");
    if (row.dataset.placeSeq) {  // place (and a country the entry lacks) come from the facility's registration
      const facility = (await verifiedLeaf(Number(row.dataset.placeSeq), checkpoint)).parsed;
      const fp = facility.payload || {};
      if (facility.kind !== "facility.registered" || fp.slug !== want.facility) return { ok: false, why: "the place shown is not the facility's registration" };
      if (!place || place.textContent.trim() !== (fp.location || "")) return { ok: false, why: "the place shown is not the registered location" };
      if ("countryFromPlace" in row.dataset) country = fp.country || "";
    } else if (place || "countryFromPlace" in row.dataset) {
      return { ok: false, why: "a place is shown without its registration entry" };
    }
    if (cellText(row, "f-country") !== country) return { ok: false, why: `the country shown is not the leaf's (${JSON.stringify(country)})` };
    return { ok: true, why: `leaf ${hex(leafHash).slice(0, 12)}\u2026 included in checkpoint ${checkpoint.size}; every field shown matches` };
  }

  function mark(cell, ok, why) {
    cell.textContent = (ok === true ? "\u2714 verified: " : "\u2718 FAILED: ") + why;
    cell.className = "verify-cell " + (ok === true ? "verify-ok" : "verify-bad");
  }

  // Fails closed: OK only when every row shown verified, each field against its leaf, under a checkpoint signed
  // by the pinned key that covers the newest entry shown. Any error (key, network, parse) fails the run.
  async function verifyAll() {
    const summary = document.getElementById("verify-summary");
    summary.hidden = false;
    summary.className = "";
    delete summary.dataset.done;
    summary.textContent = "verifying\u2026";
    const table = document.getElementById("timeline");
    const rows = Array.from(document.querySelectorAll("#timeline tbody tr[data-seq]"));
    let failed = 0, passed = 0, outcome = "fail";
    try {
      if (!window.crypto || !crypto.subtle) throw new Error("this page needs a secure context (HTTPS) for WebCrypto");
      if (!rows.length) throw new Error("there is nothing to verify on this page");
      const key = await pinnedKey();
      const checkpoint = await openCheckpoint(await text("checkpoint"), key);
      const newest = Math.max(...rows.map((r) => Number(r.dataset.seq)));
      for (const row of rows) {
        let result;
        try { result = await verifyRow(row, checkpoint, table.dataset.serial); } catch (e) { result = { ok: false, why: e.message }; }
        mark(row.querySelector(".verify-cell"), result.ok, result.why);
        if (result.ok === true) passed++; else failed++;
      }
      if (failed || passed !== rows.length || !(newest < checkpoint.size)) {
        summary.textContent = `FAILED: ${failed} of ${rows.length} entries do not verify against checkpoint ${checkpoint.size}`;
      } else {
        summary.textContent = `OK: all ${passed} entries shown verified, every field against its leaf, in checkpoint ${checkpoint.size} signed by ${key.name}`;
        outcome = "pass";
      }
    } catch (e) {
      summary.textContent = "FAILED: " + e.message;
    }
    summary.className = outcome === "pass" ? "verify-ok" : "verify-bad";
    summary.dataset.done = outcome;
  }

  document.addEventListener("DOMContentLoaded", () => {
    const button = document.getElementById("verify-all");
    if (button) button.addEventListener("click", verifyAll);
  });
})();
