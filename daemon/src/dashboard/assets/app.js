// fqdnd's dashboard. Every value from the daemon reaches the page through textContent (DNS
// names come from the network and may hold markup): no HTML is ever built from data.
'use strict';

const RESULTS = ['answered', 'denied', 'unknown_client', 'upstream_timeout', 'no_upstream',
  'concurrency_limited', 'rate_limited', 'hold_timeout', 'observer_failed', 'malformed'];
const COLORS = ['#2e7d32', '#c62828', '#6a1b9a', '#ef6c00', '#455a64', '#00838f', '#ad1457',
  '#f9a825', '#4e342e', '#1565c0'];
const MAX_ROWS = 500;

const $ = (id) => document.getElementById(id);
let token = sessionStorage.getItem('fqdnd-token') || '';
let needsToken = false;
let status = null;
let timer = null;
let live = null; // the AbortController of the open event stream

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function row(cells, cls) {
  const tr = el('tr', null, cls);
  for (const c of cells) {
    if (c instanceof Node) { const td = el('td'); td.appendChild(c); tr.appendChild(td); }
    else tr.appendChild(el('td', c));
  }
  return tr;
}

function showError(message) {
  const e = $('error');
  if (!message) { e.hidden = true; e.textContent = ''; return; }
  e.hidden = false;
  e.textContent = message;
}

function authHeaders() { return token ? { Authorization: 'Bearer ' + token } : {}; }

async function api(path) {
  const r = await fetch(path, { headers: authHeaders(), cache: 'no-store' });
  if (r.status === 401) { askToken('The token was refused.'); throw new Error('refused'); }
  if (!r.ok) throw new Error(path + ': ' + r.status + ' ' + (await r.text()));
  return r.json();
}

// Server-Sent Events over fetch (EventSource cannot send the token).
async function stream(path, onEvent) {
  if (live) live.abort();
  const ctl = new AbortController();
  live = ctl;
  try {
    const r = await fetch(path, { headers: authHeaders(), signal: ctl.signal, cache: 'no-store' });
    if (r.status === 401) { askToken('The token was refused.'); return; }
    if (!r.ok) { showError(path + ': ' + r.status + ' ' + (await r.text())); return; }
    const reader = r.body.getReader();
    const decoder = new TextDecoder();
    let buffer = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true }).replace(/\r\n/g, '\n');
      let end;
      while ((end = buffer.indexOf('\n\n')) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        let name = 'message';
        const data = [];
        for (const line of block.split('\n')) {
          if (line.startsWith('event:')) name = line.slice(6).trim();
          else if (line.startsWith('data:')) data.push(line.slice(5).replace(/^ /, ''));
        }
        if (data.length) onEvent(name, data.join('\n'));
      }
    }
  } catch (e) {
    if (e.name !== 'AbortError' && e.message !== 'refused') showError(String(e.message || e));
  }
}

function askToken(why) {
  stop();
  $('token-form').hidden = false;
  for (const s of document.querySelectorAll('section')) s.hidden = true;
  if (why) showError(why);
}

function stop() {
  if (timer) { clearInterval(timer); timer = null; }
  if (live) { live.abort(); live = null; }
}

function every(ms, f) {
  const run = () => f().catch((e) => { if (e.message !== 'refused') showError(String(e.message || e)); });
  run();
  timer = setInterval(run, ms);
}

function ms(us) { return us === null || us === undefined ? '–' : (us / 1000).toFixed(us < 10000 ? 2 : 0) + ' ms'; }
function duration(s) {
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60);
  return (h ? h + 'h ' : '') + (h || m ? m + 'm ' : '') + (s % 60) + 's';
}
function clock(t) { return new Date(t).toLocaleTimeString(); }

// ---- Overview ----
let lastDrops = null;

async function overview() {
  status = await api('/api/status');
  $('mode').textContent = status.mode + ' ' + status.version;
  const total = status.queries.reduce((n, [, v]) => n + v, 0);
  $('ov-queries-total').textContent = total;
  $('ov-identities').textContent = status.identities;
  $('ov-cache-names').textContent = status.cache_names;
  $('ov-cache-entries').textContent = status.cache_entries;
  $('ov-uptime').textContent = duration(status.uptime_seconds);
  const c = status.answer_cache;
  $('ov-hit-rate').textContent = !c ? 'cache off'
    : (c.hits + c.misses === 0 ? '–' : (100 * c.hits / (c.hits + c.misses)).toFixed(1) + ' %');
  const results = $('ov-results').tBodies[0];
  results.replaceChildren(...status.queries.map(([k, v]) => row([k, v])));
  const ups = $('ov-upstreams').tBodies[0];
  ups.replaceChildren(...status.upstreams.map((u) =>
    row([u.addr, u.alive ? 'yes' : 'no', u.failures, u.rtt_us === null ? '–' : ms(u.rtt_us)])));
  const cluster = $('ov-cluster');
  if (status.cluster) {
    $('ov-cluster-box').hidden = false;
    const items = [];
    for (const [k, v] of Object.entries(status.cluster)) {
      items.push(el('dt', k));
      items.push(el('dd', typeof v === 'object' && v !== null ? JSON.stringify(v) : v));
    }
    cluster.replaceChildren(...items);
  } else {
    $('ov-cluster-box').hidden = true;
  }
  const holds = await api('/api/holds');
  $('ov-p50').textContent = ms(holds.p50_us);
  $('ov-p99').textContent = ms(holds.p99_us);
  const series = await api('/api/series?step=10');
  draw(series);
  if (status.mode === 'node') {
    const page = await api('/api/drops?since=0');
    const now = Date.now();
    if (lastDrops) {
      const rate = (page.next - lastDrops.next) / ((now - lastDrops.at) / 1000);
      $('ov-drops').textContent = rate.toFixed(2);
    }
    lastDrops = { next: page.next, at: now };
  } else {
    $('ov-drops').textContent = 'no datapath (gateway)';
  }
}

function draw(series) {
  const canvas = $('ov-graph');
  const g = canvas.getContext('2d');
  const W = canvas.width, H = canvas.height, L = 50, B = 24, T = 8;
  g.clearRect(0, 0, W, H);
  const shown = series.results.filter(([, v]) => v.some((x) => x > 0));
  let max = 0;
  for (const [, v] of shown) for (const x of v) max = Math.max(max, x);
  max = max > 0 ? max * 1.1 : 1;
  g.strokeStyle = '#d8dde3';
  g.fillStyle = '#57606a';
  g.font = '11px sans-serif';
  for (let i = 0; i <= 4; i++) {
    const y = T + (H - T - B) * (1 - i / 4);
    g.beginPath(); g.moveTo(L, y); g.lineTo(W - 4, y); g.stroke();
    g.fillText((max * i / 4).toFixed(max < 4 ? 2 : 0), 4, y + 4);
  }
  g.fillText('-60 min', L, H - 6);
  g.fillText('now', W - 30, H - 6);
  const n = shown.length ? shown[0][1].length : 0;
  for (const [name, values] of shown) {
    g.strokeStyle = COLORS[RESULTS.indexOf(name) % COLORS.length] || '#000';
    g.lineWidth = 1.5;
    g.beginPath();
    values.forEach((v, i) => {
      const x = L + (W - L - 4) * (n > 1 ? i / (n - 1) : 0);
      const y = T + (H - T - B) * (1 - v / max);
      if (i === 0) g.moveTo(x, y); else g.lineTo(x, y);
    });
    g.stroke();
  }
  const legend = $('ov-legend');
  legend.replaceChildren(...shown.map(([name, values]) =>
    el('li', name + ' (' + values[values.length - 1].toFixed(1) + '/s)', 'c' + RESULTS.indexOf(name))));
  const last = series.results.reduce((s, [, v]) => s + v[v.length - 1], 0);
  $('ov-qps').textContent = last.toFixed(1);
}

// ---- Queries ----
function queryMatches(q) {
  const client = $('q-client').value.trim();
  const name = $('q-name').value.trim().toLowerCase();
  const verdict = $('q-verdict').value;
  return (!client || q.client.includes(client) || (q.group || '').includes(client)) && (!name || q.name.toLowerCase().includes(name))
    && (!verdict || q.result === verdict);
}

function queryRow(q) {
  const tr = row([clock(q.time_ms), q.group || '–', q.client, el('span', q.name || '(unparsable)'), q.qtype,
    el('span', q.result, 'result-' + q.result), q.rcode, q.answers, ms(q.hold_us), ms(q.total_us)]);
  tr.cells[3].className = 'name';
  tr.dataset.client = q.client;
  tr.dataset.group = q.group || '';
  tr.dataset.name = q.name;
  tr.dataset.result = q.result;
  tr.hidden = !queryMatches(q);
  return tr;
}

function refilter() {
  for (const tr of $('q-rows').rows) {
    tr.hidden = !queryMatches({ client: tr.dataset.client, group: tr.dataset.group, name: tr.dataset.name, result: tr.dataset.result });
  }
}

function queries() {
  const rows = $('q-rows');
  rows.replaceChildren();
  $('q-state').textContent = 'live';
  stream('/api/events/queries', (name, data) => {
    if (name === 'missed') { $('q-state').textContent = 'live (' + data + ' queries skipped: too fast to show)'; return; }
    if (name !== 'query') return;
    rows.insertBefore(queryRow(JSON.parse(data)), rows.firstChild);
    while (rows.rows.length > MAX_ROWS) rows.deleteRow(-1);
  });
}

// ---- Names and addresses ----
let names = [];
let identities = [];

function showNames() {
  const f = $('n-filter').value.trim().toLowerCase();
  const hit = (s) => !f || String(s).toLowerCase().includes(f);
  $('names-rows').replaceChildren(...names.filter((r) => hit(r.fqdn) || r.ips.some(hit) || hit(r.endpoint))
    .map((r) => {
      const tr = row([r.endpoint, r.source, r.fqdn, r.ttl, r.expiration_time, r.ips.join(', ')]);
      tr.cells[2].className = 'name';
      return tr;
    }));
  $('ident-rows').replaceChildren(...identities.filter((r) => hit(r.identity) || r.labels.some(hit))
    .map((r) => row([r.identity, r.labels.join(', '), r.refs])));
}

async function namesPage() {
  [names, identities] = await Promise.all([api('/api/cache'), api('/api/identities')]);
  showNames();
}

// ---- Policy ----
async function policyPage() {
  const endpoints = await api('/api/policy');
  const select = $('x-endpoint');
  const chosen = select.value;
  select.replaceChildren(...endpoints.map((e) => {
    const o = el('option', e.endpoint + ' ' + e.name);
    o.value = String(e.endpoint);
    return o;
  }));
  if (chosen) select.value = chosen;
  $('policy-list').replaceChildren(...endpoints.map((e) => {
    const box = el('div', null, 'endpoint');
    box.appendChild(el('h3', e.endpoint + ' · ' + e.name));
    box.appendChild(el('p', e.labels.join(', '), 'muted'));
    if (!e.sections.length) {
      box.appendChild(el('p', 'No rule selects it.'));
    } else {
      const t = el('table');
      const head = row(['rule', 'section', 'peers', 'ports']);
      for (const td of [...head.cells]) { const th = el('th', td.textContent); head.replaceChild(th, td); }
      t.appendChild(head);
      for (const s of e.sections) {
        t.appendChild(row([s.origin, s.section, s.peers.join(', '), s.ports], s.deny ? 'denied' : ''));
      }
      box.appendChild(t);
    }
    return box;
  }));
}

async function explain(event) {
  event.preventDefault();
  const p = new URLSearchParams({
    endpoint: $('x-endpoint').value, direction: $('x-direction').value, peer: $('x-peer').value.trim(),
    protocol: $('x-protocol').value, port: $('x-port').value.trim() || '0',
  });
  try {
    const x = await api('/api/explain?' + p.toString());
    showError('');
    $('x-result').hidden = false;
    const v = $('x-verdict');
    v.textContent = x.allowed ? 'allowed' : 'denied';
    v.className = x.allowed ? 'allowed' : 'denied';
    $('x-reason').textContent = x.reason;
    $('x-identity').textContent = x.identity;
    $('x-labels').textContent = x.labels;
    $('x-matches').replaceChildren(...x.matches.map((m) => row([m.origin, m.section, m.deny ? 'yes' : 'no', m.peer, m.ports])));
  } catch (e) {
    if (e.message !== 'refused') showError(String(e.message || e));
  }
}

// ---- Drops ----
function dropsPage() {
  const rows = $('drops-rows');
  rows.replaceChildren();
  if (!status || status.mode !== 'node') {
    $('drops-note').textContent = 'Datapath drops are reported by the node agent (`fqdnd node`); this is a ' +
      (status ? status.mode : 'daemon') + '.';
    return;
  }
  $('drops-note').textContent = 'live';
  stream('/api/events/drops', (name, data) => {
    if (name === 'missed') { $('drops-note').textContent = 'live (' + data + ' older drops not kept)'; return; }
    if (name !== 'drop') return;
    const d = JSON.parse(data);
    rows.insertBefore(row([d.seq, d.endpoint + (d.endpoint_name ? ' ' + d.endpoint_name : ''), d.seen, d.src, d.dst,
      d.proto, d.identity, d.reason]), rows.firstChild);
    while (rows.rows.length > MAX_ROWS) rows.deleteRow(-1);
  });
}

// ---- Navigation ----
const PAGES = {
  overview: () => every(2000, overview),
  queries: queries,
  names: () => every(5000, namesPage),
  policy: () => every(10000, policyPage),
  drops: dropsPage,
};

async function show() {
  stop();
  if (needsToken && !token) { askToken(); return; }
  $('token-form').hidden = true;
  const page = PAGES[location.hash.slice(1)] ? location.hash.slice(1) : 'overview';
  for (const name of Object.keys(PAGES)) {
    $('page-' + name).hidden = name !== page;
    $('nav-' + name).className = name === page ? 'active' : '';
  }
  if (!status) {
    try { status = await api('/api/status'); $('mode').textContent = status.mode + ' ' + status.version; }
    catch (e) { if (e.message !== 'refused') showError(String(e.message || e)); return; }
  }
  PAGES[page]();
}

async function start() {
  const select = $('q-verdict');
  for (const r of RESULTS) { const o = el('option', r); o.value = r; select.appendChild(o); }
  for (const id of ['q-client', 'q-name', 'q-verdict']) $(id).addEventListener('input', refilter);
  $('n-filter').addEventListener('input', showNames);
  $('x-form').addEventListener('submit', explain);
  $('token-form').addEventListener('submit', (event) => {
    event.preventDefault();
    token = $('token-input').value.trim();
    sessionStorage.setItem('fqdnd-token', token);
    showError('');
    show();
  });
  window.addEventListener('hashchange', show);
  try {
    const auth = await (await fetch('/auth', { cache: 'no-store' })).json();
    needsToken = auth.token;
  } catch (e) {
    showError('The daemon does not answer: ' + String(e.message || e));
    return;
  }
  show();
}

start();
