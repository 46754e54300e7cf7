// check.mjs - deploy/ checked offline, run by build/run_tests deploy (tests/unit/test_deploy.c).
//
//   node check.mjs k8s FILE...                      every document of each YAML file parses and
//                                                   validates against the Kubernetes 1.27 API
//                                                   schema of its apiVersion and kind
//   node check.mjs rules ALERTS.yml                 every rule has alert, expr, for,
//                                                   labels.severity, annotations.summary
//   node check.mjs names METRICS.txt ALERTS.yml DASHBOARD.json
//                                                   every metric an alert expression or a
//                                                   dashboard query names is a series of
//                                                   METRICS.txt (a scrape of dsv4 serve)
//
// Prints one line per problem and exits 1 when there is any; 0 and a summary otherwise.
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import yaml from 'js-yaml';

const require = createRequire(import.meta.url);
const problems = [];
const bad = (msg) => problems.push(msg);

// kubernetes-models lays its classes out as kubernetes-models/<group>/<version> ("v1" for the
// core group, "apps/v1", "policy/v1").
function k8sModel(apiVersion, kind) {
    try {
        return require(`kubernetes-models/${apiVersion}`)[kind];
    } catch {
        return undefined;
    }
}

// A Deployment of dsv4 serve lets a drain finish: the kubelet's SIGKILL comes after the preStop
// sleep, --drain-timeout and the 2 s dsv4 gives cut streams; liveness tolerates a whole drain
// (a draining server accepts no connection); the startup probe allows an hour of loading.
function checkTiming(where, d) {
    const spec = d.spec?.template?.spec;
    for (const c of spec?.containers ?? []) {
        const args = c.args ?? [];
        const i = args.indexOf('--drain-timeout');
        if (!args.includes('serve')) continue;
        const drain = i >= 0 ? Number(args[i + 1]) : 30;
        const sleep = c.lifecycle?.preStop?.exec?.command?.[0] === 'sleep' ? Number(c.lifecycle.preStop.exec.command[1]) : 0;
        const grace = spec.terminationGracePeriodSeconds ?? 30;
        const window = (p) => (p?.periodSeconds ?? 10) * (p?.failureThreshold ?? 3);
        if (!(grace > sleep + drain + 2)) bad(`${where}: terminationGracePeriodSeconds ${grace} <= preStop ${sleep} + drain ${drain} + 2`);
        if (!c.livenessProbe || !(window(c.livenessProbe) > drain)) bad(`${where}: the liveness probe restarts a draining server (${window(c.livenessProbe)} s <= drain ${drain} s)`);
        if (!c.startupProbe || window(c.startupProbe) < 3600) bad(`${where}: the startup probe allows ${window(c.startupProbe)} s for loading, under an hour`);
        if (c.readinessProbe?.httpGet?.path !== '/health') bad(`${where}: readiness is not GET /health`);
    }
}

function checkK8s(files) {
    let n = 0;
    for (const f of files) {
        let docs;
        try {
            docs = yaml.loadAll(readFileSync(f, 'utf8'));
        } catch (e) {
            bad(`${f}: YAML: ${e.message.split('\n')[0]}`);
            continue;
        }
        docs.filter((d) => d != null).forEach((d, i) => {
            const where = `${f} document ${i + 1} (${d.kind ?? '?'} ${d.metadata?.name ?? '?'})`;
            const Model = k8sModel(d.apiVersion, d.kind);
            if (!Model) return bad(`${where}: no schema for apiVersion ${d.apiVersion} kind ${d.kind}`);
            try {
                new Model(d).validate();
                if (d.kind === 'Deployment') checkTiming(where, d);
                n++;
            } catch (e) {
                bad(`${where}: ${e.message}`);
            }
        });
    }
    return `${n} Kubernetes objects valid`;
}

function loadRules(file) {
    const doc = yaml.load(readFileSync(file, 'utf8'));
    const rules = [];
    for (const g of doc?.groups ?? []) for (const r of g.rules ?? []) rules.push({ group: g.name, ...r });
    if (rules.length === 0) bad(`${file}: no rules under groups[].rules`);
    return rules;
}

function checkRules(file) {
    const rules = loadRules(file);
    for (const r of rules) {
        const name = `${file}: ${r.group}/${r.alert ?? r.record ?? '?'}`;
        if (!r.alert) bad(`${name}: no alert name`);
        if (typeof r.expr !== 'string' || !r.expr.trim()) bad(`${name}: no expr`);
        if (typeof r.for !== 'string' || !/^\d+[smhd]$/.test(r.for)) bad(`${name}: for is not a duration (${r.for})`);
        if (!['critical', 'warning', 'info'].includes(r.labels?.severity)) bad(`${name}: labels.severity is not critical, warning or info`);
        if (!r.annotations?.summary || !r.annotations?.description) bad(`${name}: annotations need summary and description`);
    }
    return `${rules.length} rules complete`;
}

// PromQL words that are not metric names: operators and aggregation modifiers.
const KEYWORDS = new Set(['and', 'or', 'unless', 'bool', 'by', 'without', 'on', 'ignoring', 'group_left', 'group_right', 'offset', 'inf', 'nan']);

// The metric names of a PromQL expression: identifiers outside label matchers ({...}), range
// selectors ([...]), strings and label lists (by (...), on (...)), not called as a function.
export function metricNames(expr) {
    const s = expr
        .replace(/"(?:[^"\\]|\\.)*"/g, '""')
        .replace(/\{[^}]*\}/g, ' ')
        .replace(/\[[^\]]*\]/g, ' ')
        .replace(/\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)/g, ' ')
        .replace(/\boffset\s+\w+/g, ' ')
        .replace(/\$\w+/g, ' ');
    const names = new Set();
    for (const m of s.matchAll(/(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?/g))
        if (!m[2] && !KEYWORDS.has(m[1].toLowerCase())) names.add(m[1]);
    return [...names];
}

// Sample names of a Prometheus text exposition (histograms appear as NAME_bucket, _sum, _count).
function scrapedNames(text) {
    const names = new Set();
    for (const line of text.split('\n')) {
        const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]/.exec(line);
        if (m) names.add(m[1]);
    }
    return names;
}

// Series Prometheus makes itself for every scrape target.
const SYNTHETIC = new Set(['up', 'scrape_duration_seconds', 'scrape_samples_scraped']);

function dashboardQueries(file) {
    const d = JSON.parse(readFileSync(file, 'utf8'));
    const out = [];
    const walk = (panels) => {
        for (const p of panels ?? []) {
            for (const t of p.targets ?? []) if (t.expr) out.push({ where: `${file}: panel "${p.title}" ${t.refId}`, expr: t.expr });
            walk(p.panels);
        }
    };
    walk(d.panels);
    if (out.length === 0) bad(`${file}: no panel queries`);
    for (const v of d.templating?.list ?? []) {
        const q = typeof v.query === 'string' ? v.query : v.query?.query;
        const m = q && /^label_values\(\s*([^,]+),/.exec(q); // label_values(METRIC, LABEL): METRIC only
        if (m) out.push({ where: `${file}: variable ${v.name}`, expr: m[1] });
    }
    return out;
}

function checkNames(metricsFile, alertsFile, dashboardFile) {
    const have = scrapedNames(readFileSync(metricsFile, 'utf8'));
    if (have.size === 0) bad(`${metricsFile}: no samples`);
    const uses = loadRules(alertsFile).map((r) => ({ where: `${alertsFile}: ${r.alert}`, expr: r.expr }));
    uses.push(...dashboardQueries(dashboardFile));
    const seen = new Set();
    for (const u of uses) {
        const names = metricNames(u.expr);
        if (names.length === 0) bad(`${u.where}: no metric in ${JSON.stringify(u.expr)}`);
        for (const n of names) {
            seen.add(n);
            if (!have.has(n) && !SYNTHETIC.has(n)) bad(`${u.where}: ${n} is not exported by dsv4 serve`);
        }
    }
    return `${uses.length} expressions, ${seen.size} metric names, each exported`;
}

const [mode, ...args] = process.argv.slice(2);
let summary;
try {
    if (mode === 'k8s' && args.length) summary = checkK8s(args);
    else if (mode === 'rules' && args.length === 1) summary = checkRules(args[0]);
    else if (mode === 'names' && args.length === 3) summary = checkNames(...args);
    else {
        console.error('usage: check.mjs k8s FILE... | rules ALERTS.yml | names METRICS.txt ALERTS.yml DASHBOARD.json');
        process.exit(2);
    }
} catch (e) {
    bad(e.message);
}
for (const p of problems) console.log(p);
if (problems.length) process.exit(1);
console.log(summary);
