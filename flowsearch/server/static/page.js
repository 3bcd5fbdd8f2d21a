// flowsearch's search page: plain JavaScript, no framework, no network but this server.
// Data calls send the API key the user gave (the key field, or /#key=KEY), kept in
// sessionStorage. The URL's query string holds the search (q, mode, k, where, min_score) and
// the view, so a link reproduces what is on screen.
"use strict";

(function () {
  const $ = (id) => document.getElementById(id);
  const SVG = "http://www.w3.org/2000/svg";
  const KEY_ITEM = "flowsearch.apiKey";
  const DEBOUNCE_MS = 300;

  let lastQuery = null; // the last answered query's result (the reference marks its place)
  let space = null; // GET /space, fetched once per page view of the index
  let pending = null; // the search in flight (aborted when a newer one starts)
  let timer = null;
  let seq = 0;
  let served = null; // serving a root of indexes: the names GET /indexes gave; null: one index

  // -- which index (a server of many: the picker, ?index=NAME) -------------------------------

  function indexPath(route) {
    if (served === null) return route;
    const name = $("index").value;
    return "/indexes/" + encodeURIComponent(name) + route;
  }

  // Ask /health (open) whether this server serves many indexes; if so, list them (the key is
  // needed) into the picker and keep the one the URL names, else the first.
  async function loadIndexes() {
    const health = await call("/health").catch(() => null);
    if (!health || health.indexes === undefined) return;
    $("index-picker").hidden = false;
    const wanted = new URLSearchParams(location.search).get("index") || $("index").value;
    const listed = await call("/indexes");
    served = listed.map((entry) => entry.name);
    $("index").replaceChildren(...listed.map((entry) => el("option", { value: entry.name },
      entry.name + " (" + (entry.documents ?? entry.rows).toLocaleString() + " documents)")));
    if (served.includes(wanted)) $("index").value = wanted;
    if (!served.length) throw new Error("no index is served here yet: POST /indexes/NAME builds one");
  }

  // -- the API key and calls ----------------------------------------------------------------

  function takeKeyFromFragment() {
    const m = /(?:^#|&)key=([^&]*)/.exec(location.hash);
    if (m) {
      sessionStorage.setItem(KEY_ITEM, decodeURIComponent(m[1]));
      history.replaceState(null, "", location.pathname + location.search); // off the address bar
    }
  }

  async function call(path, body, signal) {
    const headers = {};
    const key = sessionStorage.getItem(KEY_ITEM);
    if (key) headers["X-API-Key"] = key;
    const init = { headers, signal };
    if (body !== undefined) {
      init.method = "POST";
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const response = await fetch(path, init);
    let data = null;
    try {
      data = await response.json();
    } catch (e) {
      data = null;
    }
    if (!response.ok) {
      const detail = data && typeof data.detail === "string" ? data.detail
        : data && data.detail ? JSON.stringify(data.detail) : response.statusText;
      const error = new Error(detail || "HTTP " + response.status);
      error.status = response.status;
      throw error;
    }
    return data;
  }

  function showError(error) {
    const box = $("error");
    if (!error) {
      box.hidden = true;
      box.textContent = "";
      return;
    }
    box.hidden = false;
    box.textContent = error.message;
    if (error.status === 401) {
      box.textContent += " (give the key under \u201cAPI key\u201d above)";
      $("key-box").open = true;
    }
  }

  // -- the URL ----------------------------------------------------------------------------

  function formState() {
    return {
      q: $("q").value,
      mode: $("mode").value,
      k: $("k").value,
      where: $("where").value,
      min_score: $("min-score").value,
    };
  }

  function writeUrl(view, push) {
    const params = new URLSearchParams();
    const state = formState();
    for (const [name, value] of Object.entries(state)) {
      if (value.trim() !== "" && !(name === "k" && value === "10")) params.set(name, value);
    }
    if (view === "index") params.set("view", "index");
    if (served !== null && $("index").value) params.set("index", $("index").value);
    const url = location.pathname + (params.toString() ? "?" + params : "");
    if (url !== location.pathname + location.search) {
      (push ? history.pushState : history.replaceState).call(history, null, "", url);
    }
  }

  function readUrl() {
    const params = new URLSearchParams(location.search);
    $("q").value = params.get("q") || "";
    $("mode").value = ["hybrid", "dense", "lexical"].includes(params.get("mode"))
      ? params.get("mode") : "";
    $("k").value = params.get("k") || "10";
    $("where").value = params.get("where") || "";
    $("min-score").value = params.get("min_score") || "";
    return params.get("view") === "index" ? "index" : "search";
  }

  // -- searching ----------------------------------------------------------------------------

  function request() {
    const state = formState();
    const body = { query: state.q.trim(), k: Number.parseInt(state.k, 10) || 10 };
    if (state.mode) body.mode = state.mode;
    if (state.where.trim()) body.where = state.where.trim();
    if (state.min_score.trim() !== "") body.min_score = Number.parseFloat(state.min_score);
    return body;
  }

  async function search() {
    clearTimeout(timer);
    writeUrl("search", false);
    const body = request();
    if (!body.query) {
      $("hits").replaceChildren();
      $("report-box").hidden = true;
      $("status").textContent = "";
      showError(null);
      return;
    }
    if (pending) pending.abort();
    pending = new AbortController();
    const mine = ++seq;
    $("status").textContent = "Searching\u2026";
    try {
      const result = await call(indexPath("/search"), body, pending.signal);
      if (mine !== seq) return;
      showError(null);
      lastQuery = result;
      render(result, body.mode || null);
    } catch (error) {
      if (error.name === "AbortError" || mine !== seq) return;
      $("hits").replaceChildren();
      $("report-box").hidden = true;
      $("status").textContent = "";
      showError(error);
    }
  }

  function later() {
    clearTimeout(timer);
    timer = setTimeout(search, DEBOUNCE_MS);
  }

  // The words to mark are the server's (hit.marks: code-point offsets of the words whose index
  // term, stemmed as BM25 counts it, is one of the query's): the page only paints them.
  function painted(chars, from, to, marks) {
    const out = document.createDocumentFragment();
    let at = from;
    for (const [a, b] of marks) {
      if (b <= from || a >= to) continue;
      const s = Math.max(a, from);
      const e = Math.min(b, to);
      if (s > at) out.append(chars.slice(at, s).join(""));
      const mark = document.createElement("mark");
      mark.textContent = chars.slice(s, e).join("");
      out.append(mark);
      at = e;
    }
    if (at < to) out.append(chars.slice(at, to).join(""));
    return out;
  }

  function hitText(hit, mark) {
    // the document's text, its best passage (hit.highlight: code-point offsets) set apart
    const chars = Array.from(hit.text);
    const marks = mark ? hit.marks || [] : [];
    const piece = (from, to) => painted(chars, from, to, marks);
    const h = hit.highlight;
    if (!h) return [piece(0, chars.length)];
    const passage = el("span", { className: "passage", title: "the best-matching passage" },
      piece(h.start, h.end));
    return [piece(0, h.start), passage, piece(h.end, chars.length)];
  }

  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(props || {})) {
      if (name === "className") node.className = value;
      else node.setAttribute(name, value);
    }
    for (const child of children) {
      if (child !== null && child !== undefined) node.append(child);
    }
    return node;
  }

  function bar(kind, label, value, fraction) {
    const fill = el("span", { className: "fill " + kind });
    fill.style.width = (Math.max(0, Math.min(1, fraction)) * 100).toFixed(1) + "%";
    const shown = value === null || value === undefined ? "\u2013" : value.toFixed(3);
    return el("div", { className: "bar-row" },
      el("span", { className: "bar-label" }, label),
      el("span", { className: "bar", role: "presentation" }, fill),
      el("span", { className: "bar-value", "data-kind": kind }, shown));
  }

  function render(result, mode) {
    const hits = result.hits || [];
    const list = $("hits");
    const maxBm25 = Math.max(0, ...hits.map((h) => h.lexical_score || 0));
    const mark = mode !== "dense" && hits.some((h) => h.lexical_score !== null);
    list.replaceChildren(...hits.map((hit) => {
      const text = el("p", { className: "text" });
      text.append(...hitText(hit, mark));
      const meta = Object.entries(hit.metadata || {});
      const metadata = meta.length ? el("dl", { className: "metadata" },
        ...meta.flatMap(([k, v]) => [el("dt", {}, k),
          el("dd", {}, v === null ? "\u2013" : typeof v === "object" ? JSON.stringify(v) : String(v))]))
        : null;
      const bars = el("div", { className: "bars", "aria-label": "scores" },
        bar("score", "score", hit.score, hit.score),
        bar("dense", "cosine", hit.dense_score, hit.dense_score || 0),
        bar("lexical", "BM25", hit.lexical_score,
          maxBm25 > 0 ? (hit.lexical_score || 0) / maxBm25 : 0));
      return el("li", { className: "hit", tabindex: "-1", "data-id": String(hit.id) },
        el("div", { className: "hit-head" },
          el("span", { className: "rank" }, "#" + hit.rank),
          el("code", { className: "hit-id" }, String(hit.id))),
        text, bars, metadata);
    }));
    $("status").textContent = hits.length
      ? hits.length + (hits.length === 1 ? " hit" : " hits")
      : "No hits" + (request().where || request().min_score !== undefined
        ? " (the where filter or min score may exclude every row)" : "");
    renderReport(result.report);
  }

  // The library's QueryReport.to_words(), word for word (tests/test_page.py compares them).
  function shareWords(x) {
    if (x >= 100) return "all";
    if (x <= 0) return "none";
    if (x > 99 || x < 1) return Math.max(Math.floor(x * 10) / 10, 0.1).toFixed(1) + "%";
    let whole = Math.round(x);
    if (Math.abs(x - Math.trunc(x)) === 0.5 && whole % 2 === 1) whole -= 1; // half to even
    return whole + "%";
  }

  function reportWords(report) {
    if (!report) return "";
    if (report.verdict === "not judged" || report.percentile === null) {
      return "not judged: " + report.reason;
    }
    const p = report.percentile;
    if (report.verdict === "out-of-distribution") {
      return "unlike the corpus: this query is less like it than " + shareWords(100 - p) +
        " of the corpus's own passages; its hits may be weak matches";
    }
    return "like the corpus: this query is closer to it than " + shareWords(p) +
      " of the corpus's own passages";
  }

  async function renderReport(report) {
    $("report-box").hidden = !report;
    if (!report) return;
    $("report").textContent = reportWords(report);
    $("report").dataset.verdict = report.verdict;
    const pictures = await loadSpace().catch(() => null);
    drawReference($("query-place"), $("query-place-caption"), pictures, report, true);
  }

  // -- keyboard: arrows move through the hits -----------------------------------------------

  function onKey(event) {
    if (event.key !== "ArrowDown" && event.key !== "ArrowUp") return;
    const items = [...$("hits").children];
    if (!items.length) return;
    const at = items.indexOf(document.activeElement);
    const inBox = document.activeElement === $("q");
    if (at < 0 && !inBox) return;
    event.preventDefault();
    if (event.key === "ArrowDown") {
      items[Math.min(at + 1, items.length - 1)].focus();
    } else if (at <= 0) {
      $("q").focus();
    } else {
      items[at - 1].focus();
    }
  }

  // -- the index view ---------------------------------------------------------------------

  function loadSpace() {
    if (!space) space = call(indexPath("/space")).catch((e) => { space = null; throw e; });
    return space;
  }

  function fmtBytes(n) {
    const units = ["B", "KiB", "MiB", "GiB", "TiB"]; // powers of 1024: binary units
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
    return (i ? n.toFixed(1) : String(n)) + " " + units[i];
  }

  function row(cells) {
    return el("tr", {}, ...cells.map((c) => el("td", {}, c)));
  }

  async function showIndex() {
    showError(null);
    space = null; // the server may be on a newer version: measure again (it caches per version)
    try {
      const [info, history, pictures] = await Promise.all([call(indexPath("/info")),
        call(indexPath("/history")), loadSpace()]);
      renderInfo(info);
      renderHistory(history);
      $("space-words").textContent = "This index " + pictures.space_words + ".";
      drawSpectrum($("spectrum"), $("spectrum-caption"), pictures);
      drawReference($("reference"), $("reference-caption"), pictures,
        lastQuery && lastQuery.report, false);
    } catch (error) {
      showError(error);
    }
  }

  function renderInfo(info) {
    const enc = info.encoder || {};
    const cal = info.calibration || {};
    const factories = [...new Set((info.segments || []).map((s) => s.ann.factory))].join(", ");
    const pairs = [
      ["path", info.path],
      ["version", String(info.version)],
      ["rows", info.n_live.toLocaleString() + " live" +
        (info.n_deleted ? ", " + info.n_deleted.toLocaleString() + " deleted" : "")],
      ["segments", String((info.segments || []).length) + (factories ? " (" + factories + ")" : "")],
      ["encoder", enc.model + " \u00b7 " + enc.pooling + " pooling \u00b7 " + enc.dim +
        " dims \u00b7 " + enc.max_length + " tokens"],
      ["calibration", cal.name + " \u2192 " + cal.calibrator + ", searching the " +
        (cal.space === "calibrated" ? "calibrated space" : "encoder's own space")],
      ["auto's decision", cal.decision || "\u2013"],
      ["lexical side", info.lexical ? "BM25" : "none (dense only)"],
      ["size", info.bytes ? fmtBytes(info.bytes.total) : "\u2013"],
    ];
    $("summary").replaceChildren(...pairs.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
    $("segments").tBodies[0].replaceChildren(...(info.segments || []).map((s) => row([
      s.name, s.n_rows.toLocaleString(), s.n_deleted.toLocaleString(), s.ann.factory,
      fmtBytes(Object.values(s.files || {}).reduce((t, f) => t + (f.bytes || 0), 0)),
    ])));
    const schema = [["id", info.columns ? info.columns.id_type : "?"], ["text", "string"]]
      .concat((info.schema || []).map((c) => [c.name, c.type]));
    $("schema").tBodies[0].replaceChildren(...schema.map(row));
  }

  const HISTORY_SHOWN = 200;

  function renderHistory(records) {
    const newest = records.slice(-HISTORY_SHOWN).reverse();
    $("history-note").textContent = records.length > HISTORY_SHOWN
      ? "The newest " + HISTORY_SHOWN + " of " + records.length.toLocaleString() +
        " writes (all of them: flowsearch info --history)." : "";
    $("history").tBodies[0].replaceChildren(...newest.map((r) => row([
      "v" + r.version, r.time.replace("T", " ").replace("+00:00", ""), r.kind,
      r.n_rows.toLocaleString(),
      Object.entries(r.detail || {}).filter(([k, v]) => k !== "drift" && v !== null && v !== "")
        .map(([k, v]) => k + " " + (typeof v === "object" ? JSON.stringify(v) : v)).join(", "),
    ])));
  }

  // -- pictures (SVG drawn here from GET /space) ---------------------------------------------

  function svgEl(tag, attrs, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, value);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  // Draw in the figure's own pixels (readable text on a phone); 640 while it is not laid out.
  function widthOf(svg) {
    const shown = svg.parentElement ? svg.parentElement.clientWidth : 0;
    return Math.max(300, Math.min(shown || 640, 900));
  }

  function frame(svg, w, h) {
    svg.replaceChildren();
    svg.setAttribute("viewBox", "0 0 " + w + " " + h);
    svg.setAttribute("preserveAspectRatio", "xMidYMid meet");
  }

  function drawSpectrum(svg, caption, pictures) {
    const W = widthOf(svg), H = 300, L = 56, R = 16, T = 16, B = 44;
    frame(svg, W, H);
    const series = [["raw", "before calibration (raw)", pictures.raw],
      ["searched", "searched", pictures.searched]].filter((s) => s[2]);
    if (!series.length) {
      caption.textContent = "No vectors to measure.";
      return;
    }
    const n = Math.max(...series.map((s) => s[2].shares.length));
    const positive = series.flatMap((s) => s[2].shares.filter((v) => v > 0));
    const top = Math.log10(Math.max(...positive));
    const bottom = Math.floor(Math.log10(Math.max(Math.min(...positive), 1e-6)));
    const x = (i) => L + (n > 1 ? (i / (n - 1)) * (W - L - R) : 0);
    const y = (v) => T + ((top - Math.log10(Math.max(v, Math.pow(10, bottom)))) /
      Math.max(top - bottom, 1e-9)) * (H - T - B);
    // axes and decades
    for (let d = bottom; d <= Math.ceil(top); d++) {
      const yy = y(Math.pow(10, d));
      if (yy < T - 1) continue;
      svg.append(svgEl("line", { x1: L, x2: W - R, y1: yy, y2: yy, class: "grid" }));
      svg.append(svgEl("text", { x: L - 6, y: yy + 4, class: "tick", "text-anchor": "end" },
        d >= -2 ? String(Math.pow(10, d)) : "1e" + d));
    }
    svg.append(svgEl("text", { x: L + (W - L - R) / 2, y: H - 8, class: "axis",
      "text-anchor": "middle" }, "principal direction (largest first), of " + n));
    svg.append(svgEl("text", { x: 12, y: T + (H - T - B) / 2, class: "axis",
      "text-anchor": "middle", transform: "rotate(-90 12 " + (T + (H - T - B) / 2) + ")" },
    "share of length"));
    const even = 1 / series[series.length - 1][2].dim;
    svg.append(svgEl("line", { x1: L, x2: W - R, y1: y(even), y2: y(even), class: "even" }));
    svg.append(svgEl("text", { x: W - R, y: y(even) - 4, class: "tick", "text-anchor": "end" },
      "even spread (1/" + series[series.length - 1][2].dim + ")"));
    const same = pictures.space === "encoder";
    for (const [kind, , s] of series) {
      if (same && kind === "searched" && pictures.raw) continue; // the same vectors: one line
      const points = s.shares.map((v, i) => x(i).toFixed(1) + "," + y(v).toFixed(1)).join(" ");
      svg.append(svgEl("polyline", { points, class: "series " + kind, "data-series": kind,
        "data-points": String(s.shares.length) }));
    }
    const parts = series.map(([kind, label, s]) => label + ": mean cosine " +
      s.mean_cosine.toFixed(2) + ", effective dimension " + s.effective_dim.toFixed(1) +
      " of " + s.dim);
    caption.textContent = "Eigenvalue spectrum of " + pictures.n_sampled.toLocaleString() +
      " sampled rows (each scaled to length 1): how their length spreads over directions. " +
      (same ? "This index searches the encoder's own vectors, so the two are one line. "
        : "A cone of similar vectors is steep on the left; calibration flattens it toward the " +
          "even line. ") + parts.join("; ") + ".";
    const legend = svgEl("g", { class: "legend" });
    series.forEach(([kind, label], i) => {
      if (same && kind === "searched" && pictures.raw) return;
      legend.append(svgEl("line", { x1: W - 230, x2: W - 205, y1: T + 10 + i * 18,
        y2: T + 10 + i * 18, class: "series " + kind }));
      legend.append(svgEl("text", { x: W - 200, y: T + 14 + i * 18, class: "tick" },
        same ? "raw = searched" : label));
    });
    svg.append(legend);
  }

  function drawReference(svg, caption, pictures, report, small) {
    const ref = pictures && pictures.reference;
    const W = widthOf(svg), H = small ? 120 : 240, L = 40, R = 16, T = 12, B = 36;
    frame(svg, W, H);
    if (!ref) {
      svg.hidden = true;
      caption.textContent = pictures && pictures.reference_reason
        ? "No reference to place queries in: " + pictures.reference_reason + "." : "";
      return;
    }
    svg.hidden = false;
    const edges = ref.edges;
    let lo = edges[0], hi = edges[edges.length - 1];
    const score = report && report.top_score !== null && report.top_score !== undefined
      ? report.top_score : null;
    if (score !== null) { lo = Math.min(lo, score); hi = Math.max(hi, score); }
    const pad = (hi - lo) * 0.04 || 0.01;
    lo -= pad; hi += pad;
    const x = (v) => L + ((v - lo) / (hi - lo)) * (W - L - R);
    const widths = ref.shares.map((s, i) => s / Math.max(edges[i + 1] - edges[i], 1e-12));
    const most = Math.max(...widths, 1e-12);
    const y = (d) => H - B - (d / most) * (H - T - B);
    ref.shares.forEach((s, i) => {
      svg.append(svgEl("rect", { x: x(edges[i]).toFixed(1), y: y(widths[i]).toFixed(1),
        width: Math.max(0.5, x(edges[i + 1]) - x(edges[i]) - 1).toFixed(1),
        height: (H - B - y(widths[i])).toFixed(1),
        class: edges[i + 1] <= ref.cut ? "bin below" : "bin", "data-share": String(s) }));
    });
    svg.append(svgEl("line", { x1: L, x2: W - R, y1: H - B, y2: H - B, class: "grid" }));
    for (let i = 0; i <= 4; i++) {
      const v = lo + ((hi - lo) * i) / 4;
      svg.append(svgEl("text", { x: x(v), y: H - B + 14, class: "tick", "text-anchor": "middle" },
        v.toFixed(2)));
    }
    svg.append(svgEl("line", { x1: x(ref.cut), x2: x(ref.cut), y1: T, y2: H - B, class: "cut" }));
    svg.append(svgEl("text", { x: x(ref.cut) + 3, y: T + 10, class: "tick" },
      ref.cut_percentile + "th pct"));
    let placed = "";
    if (score !== null) {
      svg.append(svgEl("line", { x1: x(score), x2: x(score), y1: T, y2: H - B, class: "query",
        "data-score": String(score) }));
      svg.append(svgEl("text", { x: x(score) - 3, y: T + 22, class: "tick query-label",
        "text-anchor": "end" }, "this query"));
      placed = " The blue line is the query \u201c" + (lastQuery ? lastQuery.query : "") +
        "\u201d: its best score " + score.toFixed(3) +
        (report.percentile !== null ? ", percentile " + report.percentile : "") + ".";
    }
    if (!small) {
      svg.append(svgEl("text", { x: L + (W - L - R) / 2, y: H - 6, class: "axis",
        "text-anchor": "middle" }, W < 520 ? "a passage's best score"
        : "a passage's best score (cosine to its closest other passage)"));
    }
    caption.textContent = (small ? "" : "Distribution of the corpus's best-match scores: ") +
      ref.words + ". Median " + ref.median.toFixed(3) + "; the red line is the " +
      ref.cut_percentile + "th percentile (" + ref.cut.toFixed(3) + ")." + placed;
  }

  // The pictures again at the new width (their data is already here).
  async function redraw() {
    if (!space) return;
    const pictures = await space.catch(() => null);
    if (!pictures) return;
    if (!$("index-view").hidden) {
      drawSpectrum($("spectrum"), $("spectrum-caption"), pictures);
      drawReference($("reference"), $("reference-caption"), pictures,
        lastQuery && lastQuery.report, false);
    }
    if (!$("report-box").hidden && lastQuery && lastQuery.report) {
      drawReference($("query-place"), $("query-place-caption"), pictures, lastQuery.report, true);
    }
  }

  // -- views --------------------------------------------------------------------------------

  function show(view, push) {
    $("search-view").hidden = view !== "search";
    $("index-view").hidden = view !== "index";
    for (const tab of [$("tab-search"), $("tab-index")]) {
      if (tab.dataset.view === view) tab.setAttribute("aria-current", "page");
      else tab.removeAttribute("aria-current");
    }
    writeUrl(view, push);
    if (view === "index") showIndex();
  }

  function again() {
    space = null;
    if (!$("index-view").hidden) showIndex(); else search();
  }

  async function start() {
    takeKeyFromFragment();
    const stored = sessionStorage.getItem(KEY_ITEM);
    if (stored) $("key").value = stored;
    $("key-form").addEventListener("submit", async (event) => {
      event.preventDefault();
      sessionStorage.setItem(KEY_ITEM, $("key").value);
      $("key-box").open = false;
      try {
        await loadIndexes();
      } catch (error) {
        showError(error);
        return;
      }
      again();
    });
    $("index").addEventListener("change", () => {
      lastQuery = null;
      writeUrl($("index-view").hidden ? "search" : "index", true);
      again();
    });
    $("search-form").addEventListener("submit", (event) => {
      event.preventDefault();
      search();
    });
    $("q").addEventListener("input", later);
    $("where").addEventListener("input", later);
    $("min-score").addEventListener("input", later);
    $("k").addEventListener("input", later);
    $("mode").addEventListener("change", search);
    document.addEventListener("keydown", onKey);
    let resized = null;
    window.addEventListener("resize", () => {
      clearTimeout(resized);
      resized = setTimeout(redraw, 200);
    });
    for (const tab of [$("tab-search"), $("tab-index")]) {
      tab.addEventListener("click", (event) => {
        event.preventDefault();
        show(tab.dataset.view, true);
      });
    }
    window.addEventListener("popstate", () => {
      const named = new URLSearchParams(location.search).get("index");
      if (served !== null && served.includes(named) && named !== $("index").value) {
        $("index").value = named;
        space = null;
      }
      const view = readUrl();
      show(view, false);
      if (view === "search") search();
    });
    try {
      await loadIndexes();
    } catch (error) {
      showError(error); // a key is needed to list them: typed, the picker fills
    }
    const view = readUrl();
    show(view, false);
    if (view === "search" && $("q").value.trim()) search();
    if (view === "search") $("q").focus();
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
