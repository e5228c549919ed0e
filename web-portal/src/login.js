// Filter the list as one types; remember the last choice on this browser.
(function () {
  var list = document.getElementById('providers');
  var last = localStorage.getItem('kumo.lastProvider');
  Array.prototype.forEach.call(list.children, function (li) {
    if (li.dataset.name === last) { li.className = 'last'; list.insertBefore(li, list.firstChild); }
    li.querySelector('a').addEventListener('click', function () {
      localStorage.setItem('kumo.lastProvider', li.dataset.name);
    });
  });
  document.getElementById('filter').addEventListener('input', function (e) {
    var q = e.target.value.toLowerCase();
    Array.prototype.forEach.call(list.children, function (li) {
      li.hidden = li.textContent.toLowerCase().indexOf(q) < 0;
    });
  });
})();
