// wsctl dashboard: refreshes the page's content every few seconds while its job runs (the server draws
// everything; this only swaps the new content in), and stops once the page says its job has finished.
"use strict";
(function () {
  const every = 3000;
  async function refresh() {
    const main = document.getElementById("content");
    if (!main || main.dataset.finished === "true") return;
    try {
      const answer = await fetch(location.href, { cache: "no-store" });
      if (answer.ok) {
        const page = new DOMParser().parseFromString(await answer.text(), "text/html");
        const next = page.getElementById("content");
        if (next) {
          main.replaceWith(next);
          // How many refreshes this page has taken in: what a browser test reads to see that it refreshes.
          document.body.dataset.refreshes = String(Number(document.body.dataset.refreshes || 0) + 1);
        }
      }
    } catch (e) {
      // The dashboard stopped or a refresh failed: the page keeps what it shows and tries again.
    }
    setTimeout(refresh, every);
  }
  setTimeout(refresh, every);
})();
