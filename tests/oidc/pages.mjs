// Every portal page, in Japanese and English, at desktop and phone width:
//   node pages.mjs KUMO_URL ADMIN_TOKEN OUT_DIR PAGES_JSON
// PAGES_JSON is [[name, path, fill?], …]: with `fill` ({field: value}) the
// page's form that has those fields is filled in and sent, and what is
// checked is the page that comes back (a refused form). Signs in with the
// token, then for each language and width: a full-page screenshot
// (OUT_DIR/NAME-LANG-WIDTH.png), axe-core's violations, whether the page is
// wider than the window, whether the first Tab stop shows where the focus
// is, and where each form row's label, field and help/error sit (one line
// on a wide window; stacked in that order on a phone), and the errors
// shown beside fields. Prints a JSON report.
import { chromium } from 'playwright-core';
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
const axePath = require.resolve('axe-core/axe.min.js');
const [kumo, token, out, pagesJson] = process.argv.slice(2);
const pages = JSON.parse(pagesJson);
const browser = await chromium.launch({
  executablePath: '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking'],
});
const report = { pages: [], error: null };
try {
  // The pages' CSP forbids inline scripts: axe is injected by the test alone.
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 }, bypassCSP: true });
  const page = await context.newPage();
  await page.goto(`${kumo}/login`);
  // Without institutions the token form may already be open.
  await page.$eval('details.token-login', (d) => { d.open = true; });
  await page.fill('details.token-login input[name="token"]', token);
  await page.click('details.token-login button[type="submit"]');
  await page.waitForURL(`${kumo}/`);
  for (const lang of ['ja', 'en']) {
    await page.goto(`${kumo}/lang/${lang}`);
    for (const width of [1280, 390]) {
      await page.setViewportSize({ width, height: width > 600 ? 900 : 844 });
      for (const [name, path, fill] of pages) {
        let r = await page.goto(`${kumo}${path}`);
        if (fill) {
          const names = Object.keys(fill);
          const form = page.locator('form.create').filter({
            has: page.locator(`[name="${names[0]}"]`),
          });
          for (const [k, v] of Object.entries(fill)) {
            await form.locator(`[name="${k}"]`).fill(v);
          }
          [r] = await Promise.all([
            page.waitForNavigation(),
            form.locator('button[type="submit"]').click(),
          ]);
        }
        await page.waitForLoadState('networkidle').catch(() => {});
        const shot = `${name}-${lang}-${width}.png`;
        await page.screenshot({ path: `${out}/${shot}`, fullPage: true });
        await page.addScriptTag({ path: axePath });
        const axe = await page.evaluate(async () => {
          // eslint-disable-next-line no-undef
          const res = await axe.run(document, { resultTypes: ['violations'] });
          return res.violations.map((v) => ({
            id: v.id,
            impact: v.impact,
            help: v.help,
            nodes: v.nodes.slice(0, 3).map((n) => n.target.join(' ')),
          }));
        });
        const rows = await page.evaluate(() =>
          [...document.querySelectorAll('form.create .row:not(.submit)')].map((row) => {
            const box = (sel) => row.querySelector(sel)?.getBoundingClientRect();
            const [label, field, aside] = [box('label'), box('.field'), box('.aside')];
            const err = row.querySelector('.field-error');
            const input = row.querySelector('.field [name]');
            return {
              name: input?.getAttribute('name'),
              label: label && { top: label.top, bottom: label.bottom },
              field: field && { top: field.top, bottom: field.bottom },
              aside: aside && { top: aside.top },
              error: err ? err.textContent : null,
              value: input && input.type !== 'checkbox' ? input.value : null,
              invalid: input?.getAttribute('aria-invalid') === 'true',
              described: (input?.getAttribute('aria-describedby') || '')
                .split(' ')
                .filter((id) => id && document.getElementById(id)).length,
              has_help: !!row.querySelector('.help'),
            };
          }));
        const summary = await page.$$eval('div.error[role="alert"] a[href^="#"]', (as) =>
          as.map((a) => a.getAttribute('href')));
        const overflow = await page.evaluate(
          () => document.documentElement.scrollWidth - window.innerWidth,
        );
        // The first Tab stop: visible focus means an outline or a shadow.
        await page.keyboard.press('Tab');
        const focus = await page.evaluate(() => {
          const el = document.activeElement;
          if (!el || el === document.body) return { tag: null, visible: false };
          const s = getComputedStyle(el);
          const outline = s.outlineStyle !== 'none' && parseFloat(s.outlineWidth) > 0;
          return { tag: el.tagName, visible: outline || s.boxShadow !== 'none' };
        });
        report.pages.push({
          name,
          path,
          lang,
          width,
          status: r ? r.status() : 0,
          filled: !!fill,
          rows,
          summary,
          html_lang: await page.getAttribute('html', 'lang'),
          shot,
          axe,
          overflow,
          focus,
        });
      }
    }
  }
  // Keyboard only: the VM form is reached with Tab and sent with Enter.
  if (process.env.KUMO_KEYBOARD_VMS) {
    await page.goto(`${kumo}${process.env.KUMO_KEYBOARD_VMS}`);
    let reached = false;
    for (let i = 0; i < 80 && !reached; i++) {
      await page.keyboard.press('Tab');
      reached = await page.evaluate(() => document.activeElement?.getAttribute('name') === 'name');
    }
    report.keyboard_reached_form = reached;
    await page.keyboard.type('kbd-vm');
    await Promise.all([page.waitForNavigation(), page.keyboard.press('Enter')]);
    report.keyboard_landed = new URL(page.url()).pathname;
  }
} catch (e) {
  report.error = String(e.stack || e);
}
await browser.close();
console.log(JSON.stringify(report));
