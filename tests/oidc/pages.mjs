// Every portal page, in Japanese and English, at desktop and phone width:
//   node pages.mjs KUMO_URL ADMIN_TOKEN OUT_DIR PAGES_JSON
// PAGES_JSON is [[name, path], …]. Signs in with the token, then for each
// language and width: a full-page screenshot (OUT_DIR/NAME-LANG-WIDTH.png),
// axe-core's violations, whether the page is wider than the window, and
// whether the first Tab stop shows where the focus is. Prints a JSON report.
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
      for (const [name, path] of pages) {
        const r = await page.goto(`${kumo}${path}`);
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
