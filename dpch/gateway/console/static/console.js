// DPCH web console: plain JS, no build step, no external assets. Every value from the server is
// written with textContent or as an SVG attribute, never parsed as HTML.
'use strict';

const $ = (id) => document.getElementById(id);
const SVG = 'http://www.w3.org/2000/svg';
const COLORS = ['#2563eb', '#d92d20', '#039855', '#dc6803', '#7a5af8', '#0e9384'];
const creds = { user: '', password: '' }; // in memory only: never stored

function el(tag, props, ...children) {
  const node = document.createElement(tag);
  Object.assign(node, props || {});
  for (const c of children) node.append(c instanceof Node ? c : String(c));
  return node;
}

function svg(tag, attrs) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  return node;
}

function fmt(x) {
  if (x === null || x === undefined) return '–';
  if (typeof x !== 'number') return String(x);
  return Number.isInteger(x) ? String(x) : String(Number(x.toPrecision(6)));
}

// One request to the gateway with the analyst's credentials (as ClickHouse's play UI sends them).
async function call(method, path, params, body) {
  const qs = new URLSearchParams(params || {}).toString();
  const res = await fetch(path + (qs ? '?' + qs : ''), {
    method, body, cache: 'no-store',
    headers: { 'X-ClickHouse-User': creds.user, 'X-ClickHouse-Key': creds.password },
  });
  const text = await res.text();
  if (!res.ok) throw new Error(text.trim() || `HTTP ${res.status}`);
  return { res, text };
}

function dpParams() {
  const p = {};
  const eps = $('epsilon').value.trim();
  const dlt = $('delta').value.trim();
  if (eps) p.dpch_epsilon = eps;
  if (dlt) p.dpch_delta = dlt;
  return p;
}

function showError(message) {
  $('error').textContent = message;
  $('error').hidden = !message;
}

function busy(on, what) {
  for (const id of ['run', 'explain', 'connect']) $(id).disabled = on;
  $('status').textContent = on ? what : '';
}

// ---- catalog --------------------------------------------------------------------------------
function renderCatalog(tables) {
  const box = $('catalog');
  box.replaceChildren();
  if (!tables.length) box.append(el('p', { className: 'muted' }, 'No catalogued tables.'));
  for (const t of tables) {
    const unit = t.public ? 'public table (no privacy unit)' :
      `unit ${t.privacy_unit || '(row level)'}, ${t.neighbour}, ≤ ${t.max_groups_contributed} group(s), ` +
      `≤ ${t.max_rows_per_unit} row(s) per unit`;
    const rows = t.columns.map((c) => {
      const keys = c.public_keys_count ? el('div', { className: 'keys' },
        `public keys: ${c.public_keys.map(String).join(', ')}` +
        (c.public_keys_count > c.public_keys.length ? ` … (${c.public_keys_count})` : '')) : '';
      return el('tr', {}, el('td', {}, c.name, c.privacy_unit ? el('span', { className: 'badge' }, 'privacy unit') : '', keys), el('td', {}, c.type),
        el('td', { className: 'num' }, c.bounds ? `[${fmt(c.bounds[0])}, ${fmt(c.bounds[1])}]` : ''));
    });
    const table = el('table', {}, el('tr', {}, el('th', {}, 'column'), el('th', {}, 'type'), el('th', {}, 'bounds')), ...rows);
    box.append(el('div', { className: 'table-card' }, el('h4', {}, t.table), el('div', { className: 'muted' }, unit), table));
  }
}

// ---- budget and chart -------------------------------------------------------------------------
function renderBudget(budgets) {
  const box = $('budget');
  box.replaceChildren();
  if (!budgets.length) { box.append(el('p', { className: 'muted' }, 'No budget is set for you.')); return; }
  const head = el('tr', {}, ...['dataset', 'ε left', 'ε budget', 'δ left', 'queries'].map((h) => el('th', {}, h)));
  const rows = budgets.map((b) => {
    const frac = b.epsilon > 0 ? Math.max(0, Math.min(1, b.epsilon_left / b.epsilon)) : 0;
    const bar = el('div', { className: 'bar' }, el('div'));
    bar.firstChild.style.width = `${(100 * frac).toFixed(1)}%`;
    const tr = el('tr', { title: b.text }, el('td', {}, b.dataset, bar),
      el('td', { className: 'num eps-left' }, fmt(b.epsilon_left)), el('td', { className: 'num' }, fmt(b.epsilon)),
      el('td', { className: 'num' }, fmt(b.delta_left)), el('td', { className: 'num' }, fmt(b.queries)));
    tr.dataset.dataset = b.dataset;
    return tr;
  });
  box.append(el('table', { id: 'budget-table' }, head, ...rows),
    el('p', { className: 'muted' }, budgets.map((b) => `${b.dataset}: ${b.text}`).join('\n')));
}

// Cumulative ε charged (the charges' own ε, after any settlement) per dataset in its current budget
// generation, against time; the budget's ε as a dashed line when it fits the scale.
function renderChart(budgets, history) {
  const box = $('chart');
  box.replaceChildren();
  const W = 400, H = 210, L = 44, R = 10, T = 10, B = 28;
  const series = budgets.map((b, i) => {
    let sum = 0;
    const pts = history.filter((h) => h.dataset === b.dataset && h.generation === b.generation)
      .map((h) => ({ t: h.time, y: (sum += h.epsilon || 0) }));
    return { b, pts, color: COLORS[i % COLORS.length] };
  }).filter((s) => s.pts.length);
  if (!series.length) { box.append(el('p', { className: 'muted' }, 'No charges yet.')); return; }
  const times = series.flatMap((s) => s.pts.map((p) => p.t));
  let t0 = Math.min(...times), t1 = Math.max(...times);
  if (t1 - t0 < 1) { t0 -= 30; t1 += 30; }
  const top = Math.max(...series.map((s) => s.pts[s.pts.length - 1].y));
  const budgetTop = Math.max(...series.map((s) => s.b.epsilon));
  const ymax = (budgetTop <= 4 * top ? Math.max(top, budgetTop) : top) * 1.1 || 1;
  const x = (t) => L + (W - L - R) * (t - t0) / (t1 - t0);
  const y = (v) => H - B - (H - T - B) * v / ymax;
  const chart = svg('svg', { viewBox: `0 0 ${W} ${H}`, class: 'chart', role: 'img', 'aria-label': 'ε spent over time' });
  chart.append(svg('line', { x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: '#98a2b3' }),
    svg('line', { x1: L, y1: T, x2: L, y2: H - B, stroke: '#98a2b3' }));
  for (const v of [0, ymax / 2, ymax]) {
    const label = svg('text', { x: L - 4, y: y(v) + 3, 'text-anchor': 'end' });
    label.textContent = fmt(Number(v.toPrecision(3)));
    chart.append(label);
  }
  for (const [t, anchor] of [[t0, 'start'], [t1, 'end']]) {
    const label = svg('text', { x: x(t), y: H - 10, 'text-anchor': anchor });
    label.textContent = new Date(t * 1000).toLocaleTimeString();
    chart.append(label);
  }
  for (const s of series) {
    if (s.b.epsilon <= ymax) {
      chart.append(svg('line', { x1: L, x2: W - R, y1: y(s.b.epsilon), y2: y(s.b.epsilon), stroke: s.color,
        'stroke-dasharray': '4 3', 'stroke-opacity': 0.6, class: 'budget-line' }));
    }
    let d = `${x(t0)},${y(0)}`, prev = 0; // a step line: the spend jumps at each charge
    for (const p of s.pts) { d += ` ${x(p.t)},${y(prev)} ${x(p.t)},${y(p.y)}`; prev = p.y; }
    d += ` ${x(t1)},${y(prev)}`;
    const line = svg('polyline', { points: d, fill: 'none', stroke: s.color, 'stroke-width': 2, class: 'spend' });
    line.dataset.dataset = s.b.dataset;
    line.dataset.charges = s.pts.length;
    chart.append(line);
    for (const p of s.pts) chart.append(svg('circle', { cx: x(p.t), cy: y(p.y), r: 2.5, fill: s.color }));
  }
  const legend = el('div', { className: 'legend' }, ...series.map((s) => {
    const swatch = el('i');
    swatch.style.background = s.color;
    return el('span', {}, swatch, `${s.b.dataset}: Σε = ${fmt(s.pts[s.pts.length - 1].y)}`);
  }));
  box.append(chart, legend);
}

async function refreshBudget() {
  const [b, h] = await Promise.all([call('GET', '/dpch/budget'), call('GET', '/dpch/history')]);
  const budgets = JSON.parse(b.text), history = JSON.parse(h.text);
  renderBudget(budgets);
  renderChart(budgets, history);
}

// ---- query, explain -----------------------------------------------------------------------------
function renderResult(out) {
  const names = out.meta.map((m) => m.name);
  const numeric = out.meta.map((m) => /Int|Float|Decimal/.test(m.type));
  const head = el('tr', {}, ...out.meta.map((m) => el('th', { title: m.type }, m.name)));
  const rows = out.data.map((r) => el('tr', {}, ...r.map((v, i) =>
    el('td', { className: numeric[i] ? 'num' : '' }, v === null ? 'NULL' : typeof v === 'object' ? JSON.stringify(v) : fmt(v)))));
  $('result').replaceChildren(el('table', { id: 'result-table' }, head, ...rows),
    el('p', { className: 'muted' }, `${out.data.length} row(s), columns: ${names.join(', ')}`));
}

async function run() {
  showError('');
  $('explanation').hidden = true;
  busy(true, 'running…');
  try {
    const params = { default_format: 'JSONCompact', ...dpParams() };
    const { res, text } = await call('POST', '/', params, $('sql').value);
    renderResult(JSON.parse(text));
    const eps = res.headers.get('X-DPCH-Epsilon'), dlt = res.headers.get('X-DPCH-Delta');
    $('cost').textContent = eps === null ? 'Charged nothing (metadata query).' :
      `Charged ε = ${fmt(Number(eps))}, δ = ${fmt(Number(dlt))}`;
    $('cost').hidden = false;
  } catch (e) {
    $('result').replaceChildren();
    $('cost').hidden = true;
    showError(e.message);
  } finally {
    busy(false);
  }
  await refreshBudget().catch((e) => showError(e.message));
}

async function explain() {
  showError('');
  busy(true, 'explaining…');
  try {
    const { text } = await call('POST', '/dpch/explain', dpParams(), $('sql').value);
    const ex = JSON.parse(text);
    $('explanation').textContent = ex.text;
    $('explanation').hidden = false;
    $('cost').textContent = `Would charge ε = ${fmt(ex.epsilon)}, δ = ${fmt(ex.delta)} (nothing ran, nothing was charged)`;
    $('cost').hidden = false;
  } catch (e) {
    $('explanation').hidden = true;
    showError(e.message);
  } finally {
    busy(false);
  }
}

async function connect(ev) {
  ev.preventDefault();
  creds.user = $('user').value;
  creds.password = $('password').value;
  showError('');
  busy(true, 'connecting…');
  try {
    const cat = await call('GET', '/dpch/catalog');
    renderCatalog(JSON.parse(cat.text));
    await refreshBudget();
    $('who').textContent = `connected as ${creds.user}`;
    document.body.dataset.connected = '1';
  } catch (e) {
    $('who').textContent = 'not connected';
    delete document.body.dataset.connected;
    showError(e.message);
  } finally {
    busy(false);
  }
}

document.addEventListener('DOMContentLoaded', () => {
  $('login').addEventListener('submit', connect);
  $('run').addEventListener('click', run);
  $('explain').addEventListener('click', explain);
  $('sql').addEventListener('keydown', (e) => { if (e.key === 'Enter' && (e.ctrlKey || e.metaKey)) run(); });
});
